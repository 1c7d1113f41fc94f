"""``spark-submit … driver.py APP.py [tablecast run options]``: the pipeline's driver."""

from __future__ import annotations

import sys


def main() -> int:
    from tablecast.cli.main import main as cli

    return cli(["run", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
