"""A local folder that behaves as object storage does where it matters to the store: nothing
can be appended to, and every object written is recorded, so a test can check that a log
never rewrites what it wrote. It is a pyarrow filesystem like S3's (`pafs.PyFileSystem`), so
the code under test cannot tell it from another; no server runs (the S3 tests proper use
moto: orchestrator/testing/s3_server.py, the `s3` fixture)."""

from __future__ import annotations

import collections

import pyarrow.fs as pafs


class AppendFree(pafs.FileSystemHandler):
    def __init__(self):
        self.local = pafs.LocalFileSystem()
        self.writes: collections.Counter[str] = collections.Counter()  # path -> times written
        self.moves: collections.Counter[str] = collections.Counter()  # destination -> times

    def open_append_stream(self, path, metadata):
        raise NotImplementedError("object storage cannot append")

    def open_output_stream(self, path, metadata):
        self.writes[path] += 1
        return self.local.open_output_stream(path)

    def move(self, src, dest):
        self.moves[dest] += 1
        self.local.move(src, dest)

    # the rest: as the local filesystem does it
    def get_type_name(self):
        return "append-free"

    def normalize_path(self, path):
        return self.local.normalize_path(path)

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError("not here")

    def delete_file(self, path):
        self.local.delete_file(path)

    def copy_file(self, src, dest):
        self.writes[dest] += 1
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        return self.local.open_input_file(path)

    def equals(self, other):
        return other is self


def append_free() -> tuple[pafs.PyFileSystem, AppendFree]:
    handler = AppendFree()
    return pafs.PyFileSystem(handler), handler
