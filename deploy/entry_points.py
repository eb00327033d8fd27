"""The console scripts `learner`, `actor` and `envserver` (pyproject.toml): the whole config
file checked first, then the role's own command line (`learner/cli.py`, `actors/cli.py`,
`envservers/cli.py`).

A role validates only its own sections: roles never import each other
(docs/architecture.md), so `actors/cli.py` cannot know what a `[learner]` section may hold.
From here, above the roles, every section present in the file is validated too, and the
rules between sections (deploy/config.py `RunConfig`): a wrong-typed or impossible value in
any section is exit code 2 and a line naming the key, from every command, before anything
starts. A required field of another role's section left empty is not an error: a launcher's
template (configs/demo.toml has no `learner.model_path`) fills it for that role alone. The
launchers validate the whole file themselves and start the roles as `python -m actors.cli`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pydantic

from common.config import error_lines, read_sections


def learner() -> int:
    from learner import cli

    argv = sys.argv[1:]
    if argv[:1] in (["prepare"], ["merge-adapter"]):  # subcommands without a config file
        return cli.main(argv)
    return _checked("learner", cli.parse_args, cli.main, argv)


def actor() -> int:
    from actors import cli

    return _checked("actor", cli.parse_args, cli.main, sys.argv[1:])


def envserver() -> int:
    from envservers import cli

    return _checked("envserver", cli.parse_args, cli.main, sys.argv[1:])


def _checked(role: str, parse: Callable, main: Callable[[list[str]], int], argv: list[str]) -> int:
    args = parse(argv)  # argparse answers --help and bad flags itself
    if args.config:
        problem = whole_file_problem(args.config, list(args.overrides), role=role)
        if problem:
            print(f"{role}: {problem}", file=sys.stderr)
            return 2
    return main(argv)


def whole_file_problem(path: str, overrides: list[str], *, role: str) -> str | None:
    """What is wrong with any section of the file, or between sections, for a `role`
    process (one `  dotted.key: message` line each), or None."""
    from deploy.config import RunConfig

    try:
        data = read_sections(path, overrides)
        RunConfig.model_validate(data)
    except ValueError as e:
        if not isinstance(e, pydantic.ValidationError):
            return None  # a file that cannot be read: the role's command line says so
        wrong = [err for err in e.errors() if not _left_for_its_role(err, role)]
        return f"invalid config ({path}):\n" + error_lines(wrong) if wrong else None
    return None


def _left_for_its_role(error: dict, role: str) -> bool:
    """A required field missing from another role's section: that role's launcher sets it."""
    section = error["loc"][0] if error["loc"] else ""
    return error["type"] == "missing" and section not in (role, "broker", "storage")
