"""Model folders made from files sent with a load request (Triton's ``file:<path>`` load
parameters), which then replace the repository's folder for that model.

They live in one private temporary folder per server (mode 0700, so other local users can
neither read the uploaded code nor plant files in it), one sub-folder per load. A model's
folder is removed when the model is unloaded, when a reload replaces it, and when the server
shuts down; whatever is left at interpreter exit (a server that was never shut down) goes
then. A folder is only removed once no model version runs from it any more.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.paths import path_problem

__all__ = ["UploadDirs", "check_upload_name"]

log = logging.getLogger("seqserve.server")


def check_upload_name(rel: str) -> None:
    """Refuse a ``file:`` name that could write outside the new model folder: absolute, with
    ``..``, empty (or with an empty component), with a backslash or a NUL character. The
    message is Triton's (core ``LocalizeRepoAgent``), with the reason instead of the path."""
    problem = path_problem(rel)
    if problem is not None:
        raise InferenceError(
            Code.INVALID_ARG,
            f"Invalid file parameter 'file:{rel}' must stay within model directory (the name {problem})",
        )


class UploadDirs:
    """The private folders of one server's uploaded models."""

    def __init__(self) -> None:
        self._root: Path | None = None

    @property
    def root(self) -> Path | None:
        """The server's private upload folder, once something was uploaded."""
        return self._root

    def _ensure_root(self) -> Path:
        if self._root is None or not self._root.is_dir():
            self._root = Path(tempfile.mkdtemp(prefix="seqserve-uploads-"))  # mode 0700
            atexit.register(_remove_tree, self._root)
        return self._root

    def create(self, name: str, files: Mapping[str, bytes]) -> Path:
        """Write ``files`` ({"1/model.py": content}) into a new folder; returns the model
        folder (``<private folder>/<load>/<name>``). Blocking I/O: call it off the event loop.
        Every name is checked before anything is written."""
        for rel in files:
            check_upload_name(rel)
        holder = Path(tempfile.mkdtemp(prefix="load-", dir=self._ensure_root()))
        model_dir = holder / name
        try:
            model_dir.mkdir()
            base = model_dir.resolve()
            for rel, content in files.items():
                target = model_dir / rel
                # Nothing in a fresh folder can be a symlink; checked anyway, as Triton does.
                if base not in target.resolve().parents:
                    raise InferenceError(
                        Code.INVALID_ARG, f"Invalid file parameter 'file:{rel}' must stay within model directory"
                    )
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
                except OSError as e:
                    raise InferenceError(
                        Code.INVALID_ARG, f"Invalid file parameter 'file:{rel}': {e.strerror or e}"
                    ) from None
        except BaseException:
            _remove_tree(holder)
            raise
        return model_dir

    def owns(self, model_dir: Path) -> bool:
        """Whether ``model_dir`` is an upload folder made here."""
        return self._root is not None and Path(model_dir).parent.parent == self._root

    def remove(self, model_dir: Path) -> None:
        """Remove an upload folder made by ``create`` (anything else is left alone)."""
        if self.owns(model_dir):
            _remove_tree(Path(model_dir).parent)

    def remove_all(self) -> None:
        """Remove the private folder and everything in it (the atexit hook then finds it gone)."""
        if self._root is not None:
            _remove_tree(self._root)


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not remove the upload folder %s: %s", path, e)
