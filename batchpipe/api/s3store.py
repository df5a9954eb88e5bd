"""``api.store: s3``: file bytes in S3-compatible object storage, through boto3.

Objects are ``api.s3_prefix + file id`` in ``api.s3_bucket``; ``api.s3_endpoint_url``
points at any S3-compatible server (MinIO, Ceph, ...), empty for AWS. Credentials come
from boto3's usual sources (environment, shared files, instance roles) — never from
batchpipe's configuration. Uploads go through boto3's managed transfer (multipart for
large files), downloads are streamed. Tested against moto's S3 server over real HTTP;
never run against AWS or another cloud (docs/api.md).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import ClientError

from batchpipe.api.store import CHUNK_BYTES, FileStore
from worker.config import ApiConfig


class S3Store(FileStore):
    def __init__(self, api: ApiConfig) -> None:
        super().__init__(Path(api.store_dir).expanduser() / "staging")
        self._bucket = api.s3_bucket
        self._prefix = api.s3_prefix
        self._s3: Any = boto3.client(
            "s3", endpoint_url=api.s3_endpoint_url or None, region_name=api.s3_region
        )

    def _key(self, name: str) -> str:
        return self._prefix + name

    def put(self, name: str, source: Path) -> None:
        self._s3.upload_file(str(source), self._bucket, self._key(name))

    def chunks(self, name: str) -> Iterator[bytes]:
        try:
            body = self._s3.get_object(Bucket=self._bucket, Key=self._key(name))["Body"]
        except ClientError as exc:
            if _missing(exc):
                raise FileNotFoundError(name) from exc
            raise
        return _iterate(body)

    @contextmanager
    def local_copy(self, name: str) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(dir=self._staging_dir) as tmp:
            path = Path(tmp) / name
            try:
                self._s3.download_file(self._bucket, self._key(name), str(path))
            except ClientError as exc:
                if _missing(exc):
                    raise FileNotFoundError(name) from exc
                raise
            yield path

    def delete(self, name: str) -> None:
        self._s3.delete_object(Bucket=self._bucket, Key=self._key(name))

    def check(self) -> None:
        self._s3.head_bucket(Bucket=self._bucket)


def _iterate(body: Any) -> Iterator[bytes]:
    with contextlib.closing(body):
        yield from body.iter_chunks(CHUNK_BYTES)


def _missing(exc: ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code")) in {"404", "NoSuchKey", "NotFound"}
