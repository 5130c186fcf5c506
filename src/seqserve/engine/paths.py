"""Paths that a model config names, kept inside the model's directory.

A config can come over the network (the load API's ``config`` parameter, in explicit model
control mode), so a file name in it must not lead the server to files outside the model:
``default_model_filename: "/home/me/evil.py"`` or ``"../../other_model/1/model.py"`` would
make the python backend import any ``.py`` on the server's disk.

The rule, for every path a config or a config ``parameters`` entry names:

* it is relative to the folder its field is defined against (the version folder for
  ``default_model_filename``, ``<model>/initial_state`` for ``data_file``...);
* no absolute path, no ``..`` component, no empty name, no backslash, no NUL character.

Symlinks are followed: a symlink inside a model directory can only have been placed by the
repository's owner (uploads through the load API write plain files, into a fresh private
directory), who is trusted like the rest of the repository's contents, the model code
included. Model stores often link version folders or large weight files from elsewhere;
the check is lexical so that those keep working, and a config that names a path cannot
reach anything the owner did not link into the model's directory.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from seqserve.engine.errors import ModelConfigError

__all__ = ["check_relative_path", "inside", "path_problem"]


def path_problem(rel: str) -> str | None:
    """Why ``rel`` is not an acceptable relative path inside a folder, or None when it is."""
    if not rel:
        return "is empty"
    if "\x00" in rel:
        return "contains a NUL character"
    if "\\" in rel:
        return "contains a backslash"
    if rel.startswith("/"):
        return "is an absolute path"
    parts = rel.split("/")
    if ".." in parts:
        return "contains '..'"
    if any(p == "" for p in parts[:-1]) or parts[-1] == "":
        return "has an empty path component"
    return None


def check_relative_path(rel: str, what: str, where: str) -> PurePosixPath:
    """``rel`` as a relative path; raises ModelConfigError naming ``what`` (the config field)
    and ``where`` (the folder it is relative to) when it could lead outside that folder."""
    problem = path_problem(rel)
    if problem is not None:
        raise ModelConfigError(
            f"{what} '{rel}' {problem}: it must be a file inside {where} "
            "(a relative path without '..', not an absolute path)"
        )
    return PurePosixPath(rel)


def inside(base: Path, rel: str, what: str, where: str = "") -> Path:
    """``base / rel`` after ``check_relative_path``; ``where`` describes ``base`` in the error
    (default: the folder itself)."""
    return Path(base) / check_relative_path(rel, what, where or f"'{base}'")
