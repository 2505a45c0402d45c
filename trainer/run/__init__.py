"""A run folder and its life: the layout (RunDir, RunContext), its lock, its schedule.json, the device, and the session
that opens it from the command line's arguments."""
