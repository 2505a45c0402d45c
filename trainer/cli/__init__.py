"""The command line: Click commands that parse, make one call and print; the launchers' and the container's entrance;
the doctor."""
