"""Verify, the clean room and the reward rule: one room.

    run           verify's commands in a fresh context (hardened), the reward file read back, bounded
    cleanroom     hidden verify files, artifacts copied out as bytes, the clean room made and furnished
    verification  where verify runs (the workspace or a clean room) and the score: `verify_task`
    score         the reward rule, pure: a reward file's number, else passed / total, else null

Nothing is imported here: users name the module they need.
"""
