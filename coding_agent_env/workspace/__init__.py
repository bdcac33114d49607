"""One task's workspace, from provision to teardown: the lifecycle rollouts and interactive episodes share.

    provision -> files -> setup -> (the driver's commands) -> verify in place or in a clean room -> score
              -> teardown (shielded, once)

    lifecycle   `Workspace`: the sandbox, its setup, verify and score, its teardown and the facts it reports
    commands    the task-command runner (each command's deadline, output cap and redaction)
    setup       the task's setup commands, stopping at the first failure
    verify/     verify, the clean room and the reward rule
    budget      each stage's deadline; limits: a task's sandbox limits against the server's caps
    writable    whether a task's file texts can be written at all; redact: secrets out of every text

`rollout/` drives it with a CLI agent between setup and verify; `episode/` with the trainer's `terminal`
commands. Nothing is imported here: the client needs only `budget`, without the sandbox machinery.
"""
