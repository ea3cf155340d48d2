"""Named snapshots of the calling tenant: checkpoints promoted to outlive their
sandbox, their bundles (one checksummed stream), pulls between servers and the
snapshot store (push, pull_stored, list_stored, delete_stored)."""

from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Optional, Union

from . import _wire
from ._transport import Transport
from .errors import LockstepError, fork_results


class Snapshots:
    """``Snapshots(api_url=..., api_key=...)``: the same methods as the TypeScript SDK's ``ls.snapshots``."""

    def __init__(self, *, api_url: Optional[str] = None, api_key: Optional[str] = None, **transport_options: Any):
        self._t = Transport(api_url, api_key, **transport_options)

    def create(self, checkpoint_id: str, *, name: Optional[str] = None, metadata: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        return _wire.create_snapshot(self._t, checkpoint_id=checkpoint_id, name=name, metadata=metadata)

    def list(self) -> List[Dict[str, Any]]:
        return _wire.list_snapshots(self._t)

    def get(self, ref: str) -> Dict[str, Any]:
        return _wire.get_snapshot(self._t, snap=ref)

    def delete(self, ref: str) -> None:
        _wire.delete_snapshot(self._t, snap=ref)

    def context(self, ref: str) -> Any:
        return _wire.get_snapshot_context(self._t, snap=ref)["context"]

    def start(self, ref: str, count: int = 1) -> List[Union[str, LockstepError]]:
        """Starts sandboxes from the snapshot: one result per sandbox, in order, its id
        (``Sandbox.connect`` it) or, for one that failed, its error (not raised)."""
        return fork_results(_wire.start_snapshot_sandboxes(self._t, snap=ref, count=count))

    def export(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The bundle, chunk by chunk (write them to a file: ``for c in snaps.export(id): f.write(c)``)."""
        resp = _wire.export_snapshot(self._t, snap=ref)
        try:
            yield from resp.iter_chunks(chunk_size)
        finally:
            resp.close()

    def import_(self, bundle: Union[BinaryIO, Iterable[bytes]], *, name: Optional[str] = None) -> Dict[str, Any]:
        """Uploads a bundle (a binary file or an iterable of chunks), streamed; nothing is kept unless it verifies."""
        if hasattr(bundle, "read"):
            f = bundle

            def chunks() -> Iterator[bytes]:
                while True:
                    c = f.read(1 << 20)  # type: ignore[union-attr]
                    if not c:
                        return
                    yield c

            body: Iterable[bytes] = chunks()
        else:
            body = bundle  # type: ignore[assignment]
        # The bundle's bytes: a body the document does not describe, so sent here.
        return self._t.json(*_wire.route("importSnapshot"), query={"name": name}, body=body)

    def pull(self, from_url: str, snapshot: str, token: str, *, name: Optional[str] = None) -> Dict[str, Any]:
        """Makes the server pull a snapshot from another server (``from_url``) with a token of the tenant there."""
        return _wire.pull_snapshot(self._t, from_=from_url, snapshot=snapshot, token=token, name=name)

    def push(self, ref: str, *, key: Optional[str] = None) -> Dict[str, Any]:
        """Makes the server export the snapshot into the tenant's part of its snapshot store
        under ``key`` (default: the snapshot's name, else its id); chunks already stored are not sent again."""
        return _wire.push_snapshot(self._t, snap=ref, key=key)

    def pull_stored(self, key: str, *, name: Optional[str] = None) -> Dict[str, Any]:
        """Makes the server import the bundle stored under ``key`` in the tenant's part of its store."""
        return _wire.pull_stored_bundle(self._t, key=key, name=name)

    def list_stored(self) -> List[Dict[str, Any]]:
        """The bundles in the tenant's part of the server's snapshot store."""
        return _wire.list_stored_bundles(self._t)

    def delete_stored(self, key: str) -> None:
        _wire.delete_stored_bundle(self._t, key=key)
