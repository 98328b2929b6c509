"""``python -m changewatch.pipeline.cli``: the `changewatch` command."""

from changewatch.pipeline.cli.command_line import main

if __name__ == "__main__":
    raise SystemExit(main())
