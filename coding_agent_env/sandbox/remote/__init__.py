"""Remote backends: engines that offer only "run this argv" and "put/get this file" (`hf`, `e2b`), their
sandboxes launcher-driven (`base.RemoteSandbox`)."""
