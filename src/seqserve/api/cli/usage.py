"""The parser class of every `seqserve` command: no flag abbreviations (a prefix such as
`--grpc-keepalive-time` must never be read as a longer flag), and a refused command line
answered with one line that names the flag and what it accepts, not the whole usage."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

#: argparse's wording "argument --flag: message" (or "argument --a/--b: message")
_ARGUMENT_PREFIX = re.compile(r"^argument (\S+?)(?:/\S+)?: ")


class CommandParser(argparse.ArgumentParser):
    """argparse.ArgumentParser with allow_abbrev off, for itself and the subcommands it
    adds (add_subparsers hands this class on), and one-line refusals (exit status 2)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        line = _ARGUMENT_PREFIX.sub(r"\1: ", message)
        command = self.prog.split()[0]  # "seqserve", as every refusal of the command line begins
        self.exit(2, f"{command}: {line} (see '{self.prog} --help')\n")
