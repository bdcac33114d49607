"""The in-sandbox launcher's files (standard library only): copied into sandboxes and run there, never
imported by the server. `launcher.py` is the entry point and documents the modes."""
