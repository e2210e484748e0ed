"""Run directories kept in storage: a storage URI (``s3://``, ``gs://``, ``hdfs://``, ``file://``)
as ``run.out``, ``--out`` or ``--resume``.

A run whose directory is a URI writes into a local working copy (actors, TensorBoard and
the report all write plain files) and `RemoteRunDir` mirrors that copy to the URI: every
file changed since the last push, at start, every ``run.sync_every_s``, after each
checkpoint, after the report and when the run closes, so a job whose node or temporary
directory disappears keeps what it had written. A plain path, including a shared mount such
as ``/mnt/shared/runs``, is written in place as before.

What a reader of the URI sees is never half written:

- a file is uploaded under a temporary name and moved into place where the storage renames
  atomically (local disks, mounts, HDFS); an object store's upload of one object is atomic by
  itself, so it is written directly;
- a checkpoint folder is uploaded whole before ``checkpoints/latest`` names it (its
  ``driver.json`` last, which is what `pull` requires of a folder that ``latest`` does not
  name), and older folders are deleted only after that.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from troupe.platform.errors import ConfigError, TroupeError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

log = logging.getLogger("troupe")

# The schemes pyarrow.fs opens (its S3, GCS and HDFS filesystems come with the wheel); a URI
# with another scheme is refused when the config is read, not when the first checkpoint is due.
SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
_ATOMIC_PUT = ("s3", "gcs", "abfs")  # pyarrow type names of object stores: a put is all or nothing
CHECKPOINTS = "checkpoints"
_CHUNK = 8 << 20


class StorageError(TroupeError):
    """A run directory in storage could not be read or written; the message names the URI."""


def is_uri(where: str | os.PathLike[str] | None) -> bool:
    """True for ``scheme://...``; a plain path (relative, absolute or ``~``) is not one."""
    return where is not None and "://" in str(where)


def check_location(where: str, key: str) -> None:
    """A `ConfigError` naming ``key`` when ``where`` is a URI whose scheme troupe cannot open."""
    if not is_uri(where):
        return
    scheme = str(where).split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            f"{key} = {where!r}: troupe cannot write a run directory to {scheme}:// storage; use a path "
            f"(a shared mount works as it is) or a URI with one of {', '.join(s + '://' for s in SCHEMES)}"
        )


def join(base: str, name: str) -> str:
    """``base/name`` for a path or a URI."""
    return f"{str(base).rstrip('/')}/{name}"


def open_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of ``uri``, with a `StorageError` that names it on failure."""
    import pyarrow.fs as pafs

    check_location(uri, "the run directory")
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError or its own errors per scheme
        raise StorageError(f"cannot open {uri!r} ({type(e).__name__}: {e}); check the URI and the "
                           "storage's credentials (e.g. AWS_* or GOOGLE_APPLICATION_CREDENTIALS)") from None
    return fs, path.rstrip("/")


class RemoteRunDir:
    """A run directory at ``uri``, mirrored from (`push`) and to (`pull`) a local folder."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.fs, self.root = open_uri(self.uri)
        self._atomic_put = self.fs.type_name in _ATOMIC_PUT
        self._pushed: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) last pushed

    # -- reading --------------------------------------------------------------------------
    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self._info(self.root).type != pafs.FileType.NotFound

    def has(self, rel: str) -> bool:
        import pyarrow.fs as pafs

        return self._info(self._path(rel)).type == pafs.FileType.File

    def files(self, rel: str = "") -> list[str]:
        """Every file under ``rel`` (relative to the run directory), sorted."""
        import pyarrow.fs as pafs

        base = self._path(rel) if rel else self.root
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        except OSError as e:
            raise StorageError(f"cannot list {self.uri}/{rel} ({e})") from None
        prefix = self.root + "/"
        return sorted(i.path[len(prefix):] for i in infos if i.type == pafs.FileType.File
                      and not PurePosixPath(i.path).name.startswith("."))

    def read_text(self, rel: str) -> str:
        try:
            with self.fs.open_input_stream(self._path(rel)) as f:
                return f.read().decode()
        except (OSError, FileNotFoundError) as e:
            raise StorageError(f"cannot read {self.uri}/{rel} ({e})") from None

    def checkpoint_names(self) -> list[str]:
        """The ``step-<N>`` folders whose upload finished (they hold ``driver.json``), oldest first."""
        names = {PurePosixPath(rel).parts[1] for rel in self.files(CHECKPOINTS)
                 if len(PurePosixPath(rel).parts) == 3 and PurePosixPath(rel).name == "driver.json"}
        return sorted(n for n in names if n.startswith("step-"))

    def latest_checkpoint(self) -> str | None:
        """The folder ``checkpoints/latest`` names, else the newest complete one."""
        if self.has(f"{CHECKPOINTS}/latest"):
            name = self.read_text(f"{CHECKPOINTS}/latest").strip()
            if self.has(f"{CHECKPOINTS}/{name}/driver.json"):
                return name
        done = self.checkpoint_names()
        return done[-1] if done else None

    def pull(self, dest: str | Path, checkpoints: str = "latest") -> Path:
        """Copy the run directory into ``dest``: every file outside ``checkpoints/``, and the
        checkpoints named by ``checkpoints`` (``latest``, ``all`` or ``none``)."""
        if checkpoints not in ("latest", "all", "none"):
            raise ValueError(f"checkpoints={checkpoints!r}: expected latest, all or none")
        if not self.exists():
            raise StorageError(f"{self.uri} does not exist: is it the run directory's URI?")
        dest = Path(dest)
        wanted: set[str] = set()
        if checkpoints == "all":
            wanted = set(self.checkpoint_names())
        elif checkpoints == "latest" and (name := self.latest_checkpoint()):
            wanted = {name}
        for rel in self.files():
            parts = PurePosixPath(rel).parts
            if parts[0] == CHECKPOINTS and (len(parts) < 3 or parts[1] not in wanted):
                continue  # pointers are rewritten below; unfinished or unwanted folders stay behind
            self._download(rel, dest / rel)
        if wanted:
            newest = max(wanted)
            (dest / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
            (dest / CHECKPOINTS / "latest").write_text(newest + "\n")
        return dest

    # -- writing --------------------------------------------------------------------------
    def push(self, local: str | Path) -> int:
        """Upload every file of ``local`` outside ``checkpoints/`` that changed since the last
        push; returns how many were uploaded."""
        local = Path(local)
        n = 0
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            rel = path.relative_to(local).as_posix()
            if rel.split("/", 1)[0] == CHECKPOINTS or path.name.startswith(".") and path.name.endswith(".tmp"):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:  # a tracker replaced it while we listed
                continue
            stamp = (st.st_size, st.st_mtime_ns)
            if self._pushed.get(rel) == stamp:
                continue
            self._upload(path, rel)
            self._pushed[rel] = stamp
            n += 1
        return n

    def push_checkpoint(self, folder: str | Path, keep: list[str]) -> None:
        """Upload the checkpoint ``folder`` (``.../checkpoints/step-<N>``), point ``latest`` at
        it, then delete the folders here that are not in ``keep`` (the local ones kept)."""
        folder = Path(folder)
        name = folder.name
        files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.name == "driver.json")
        final = self._path(f"{CHECKPOINTS}/{name}")
        if self._atomic_put:
            self._delete_dir(final)
            for p in files:  # driver.json last: a folder without it is unfinished
                self._put(p, f"{final}/{p.relative_to(folder).as_posix()}")
        else:
            tmp = self._path(f"{CHECKPOINTS}/.{name}.{uuid.uuid4().hex[:8]}.tmp")
            for p in files:
                self._put(p, f"{tmp}/{p.relative_to(folder).as_posix()}")
            self._delete_dir(final)
            self._move(tmp, final)
        self._upload_bytes((name + "\n").encode(), f"{CHECKPOINTS}/latest")
        for old in self.checkpoint_names():
            if old not in keep:
                self._delete_dir(self._path(f"{CHECKPOINTS}/{old}"))

    # -- internals ------------------------------------------------------------------------
    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def _info(self, path: str) -> pafs.FileInfo:
        try:
            return self.fs.get_file_info(path)
        except OSError as e:
            raise StorageError(f"cannot reach {self.uri} ({e}); check the URI and the storage's credentials") from None

    def _upload(self, path: Path, rel: str) -> None:
        final = self._path(rel)
        if self._atomic_put:
            self._put(path, final)
            return
        parent, name = final.rsplit("/", 1)
        tmp = f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
        self._put(path, tmp)
        self._move(tmp, final)

    def _upload_bytes(self, data: bytes, rel: str) -> None:
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            self._upload(Path(f.name), rel)

    def _put(self, path: Path, dest: str) -> None:
        try:
            self.fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
            with open(path, "rb") as src, self.fs.open_output_stream(dest) as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
        except OSError as e:
            raise StorageError(f"cannot write {dest} in {self.uri} ({e})") from None

    def _move(self, src: str, dest: str) -> None:
        try:
            self.fs.move(src, dest)
        except OSError as e:
            raise StorageError(f"cannot move {src} to {dest} in {self.uri} ({e})") from None

    def _delete_dir(self, path: str) -> None:
        import pyarrow.fs as pafs

        if self._info(path).type == pafs.FileType.Directory:
            try:
                self.fs.delete_dir(path)
            except OSError as e:
                raise StorageError(f"cannot delete {path} in {self.uri} ({e})") from None

    def _download(self, rel: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with self.fs.open_input_stream(self._path(rel)) as src, open(tmp, "wb") as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
            os.replace(tmp, dest)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"cannot read {self.uri}/{rel} ({e})") from None


def staging_dir(name: str) -> Path:
    """A fresh local working copy for a run kept at a URI (under ``$TROUPE_STAGING_DIR`` when
    set, else the system's temporary directory)."""
    base = os.environ.get("TROUPE_STAGING_DIR")
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"troupe-{name}-", dir=base))


def fetch(src: str, dest: str | Path, checkpoints: str = "all", force: bool = False) -> Path:
    """Copy the run directory ``src`` (a URI or a path) to the local folder ``dest``."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()) and not force:
        raise TroupeError(f"{dest} exists and is not empty: choose a new folder or pass --force")
    if is_uri(src):
        remote = RemoteRunDir(src)
        if not remote.has("config.yaml"):
            raise TroupeError(f"{src} is not a run directory (no config.yaml there)")
        return remote.pull(dest, checkpoints)
    path = Path(src)
    if not (path / "config.yaml").is_file():
        raise TroupeError(f"{src} is not a run directory (no config.yaml there)")
    ignore = None
    if checkpoints != "all":
        latest = (path / CHECKPOINTS / "latest")
        keep = {latest.read_text().strip()} if checkpoints == "latest" and latest.is_file() else set()

        def ignore(folder: str, names: list[str]) -> list[str]:
            if Path(folder) == path / CHECKPOINTS:
                return [n for n in names if n.startswith("step-") and n not in keep]
            return []
    shutil.copytree(path, dest, ignore=ignore, dirs_exist_ok=True)
    return dest
