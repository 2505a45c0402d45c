"""The image's entrypoint (under tini): `docker run IMAGE [AGENT] [OPTIONS]` is `trainer launch --container`,
with its help and usage errors in the words the user typed (docker run ... IMAGE, not trainer launch)."""

from __future__ import annotations

import sys

from trainer.cli.launch_command import CONTAINER, launch
from trainer.cli.options import start_invocation


def main() -> None:
    start_invocation(None, None, False)  # what the `trainer` group does first; the command's --debug still works
    launch.main(args=["--container", *sys.argv[1:]], prog_name="docker run IMAGE", obj=CONTAINER)


if __name__ == "__main__":
    main()
