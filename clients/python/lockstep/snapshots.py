"""Named snapshots of the calling tenant: checkpoints promoted to outlive their
sandbox, their bundles (one checksummed stream), pulls between servers and the
snapshot store (push, pull_stored, list_stored, delete_stored)."""

from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Optional, Union
from urllib.parse import quote

from ._transport import Transport
from .errors import LockstepError, fork_results


def _path(ref: str) -> str:
    return "/snapshots/" + quote(ref, safe="")


class Snapshots:
    """``Snapshots(api_url=..., api_key=...)``: the same methods as the TypeScript SDK's ``ls.snapshots``."""

    def __init__(self, *, api_url: Optional[str] = None, api_key: Optional[str] = None, **transport_options: Any):
        self._t = Transport(api_url, api_key, **transport_options)

    def create(self, checkpoint_id: str, *, name: Optional[str] = None, metadata: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"checkpointId": checkpoint_id}
        if name is not None:
            body["name"] = name
        if metadata is not None:
            body["metadata"] = metadata
        return self._t.json("POST", "/snapshots", json_body=body)

    def list(self) -> List[Dict[str, Any]]:
        return self._t.json("GET", "/snapshots")

    def get(self, ref: str) -> Dict[str, Any]:
        return self._t.json("GET", _path(ref))

    def delete(self, ref: str) -> None:
        self._t.request("DELETE", _path(ref)).read()

    def context(self, ref: str) -> Any:
        return self._t.json("GET", _path(ref) + "/context")["context"]

    def start(self, ref: str, count: int = 1) -> List[Union[str, LockstepError]]:
        """Starts sandboxes from the snapshot: one result per sandbox, in order, its id
        (``Sandbox.connect`` it) or, for one that failed, its error (not raised)."""
        return fork_results(self._t.json("POST", _path(ref) + "/sandboxes", json_body={"count": count}))

    def export(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The bundle, chunk by chunk (write them to a file: ``for c in snaps.export(id): f.write(c)``)."""
        resp = self._t.request("GET", _path(ref) + "/bundle", accept="application/octet-stream")
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
        return self._t.json("POST", "/snapshots/import", query={"name": name}, body=body)

    def pull(self, from_url: str, snapshot: str, token: str, *, name: Optional[str] = None) -> Dict[str, Any]:
        """Makes the server pull a snapshot from another server (``from_url``) with a token of the tenant there."""
        body: Dict[str, Any] = {"from": from_url, "snapshot": snapshot, "token": token}
        if name is not None:
            body["name"] = name
        return self._t.json("POST", "/snapshots/pull", json_body=body)

    def push(self, ref: str, *, key: Optional[str] = None) -> Dict[str, Any]:
        """Makes the server export the snapshot into the tenant's part of its snapshot store
        under ``key`` (default: the snapshot's name, else its id); chunks already stored are not sent again."""
        body: Dict[str, Any] = {}
        if key is not None:
            body["key"] = key
        return self._t.json("POST", _path(ref) + "/push", json_body=body)

    def pull_stored(self, key: str, *, name: Optional[str] = None) -> Dict[str, Any]:
        """Makes the server import the bundle stored under ``key`` in the tenant's part of its store."""
        body: Dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        return self._t.json("POST", "/store/bundles/" + quote(key, safe="") + "/pull", json_body=body)

    def list_stored(self) -> List[Dict[str, Any]]:
        """The bundles in the tenant's part of the server's snapshot store."""
        return self._t.json("GET", "/store/bundles")

    def delete_stored(self, key: str) -> None:
        self._t.request("DELETE", "/store/bundles/" + quote(key, safe="")).read()
