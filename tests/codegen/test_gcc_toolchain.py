"""gcc invocation and the content-addressed build cache."""
import ctypes
import threading

import pytest

from hidetc.backends.toolchain.cache import BuildCache, cache_key, default_cache_dir
from hidetc.backends.toolchain.gcc import (
    build_shared_library,
    compile_object,
    compile_objects,
    host_flags,
    link_shared,
)
from hidetc.errors import ToolchainError

GOOD = """
#include <stdint.h>
__attribute__((visibility("default"))) int32_t answer(void) { return 42; }
"""
OTHER = """
#include <stdint.h>
__attribute__((visibility("default"))) int32_t other(int32_t x) { return x + 1; }
"""


@pytest.fixture
def cache(tmp_path):
    return BuildCache(tmp_path / "cache")


def test_same_source_hits_the_cache(cache):
    first = compile_object("good", GOOD, cache=cache)
    mtime = first.stat().st_mtime_ns
    again = compile_object("renamed", GOOD, cache=cache)
    assert again == first and again.stat().st_mtime_ns == mtime
    assert first.parent.parent.name == "objects"
    assert (cache.root / "build").is_dir()  # the source was kept for reproduction


def test_changed_flag_or_source_rebuilds(cache):
    base = compile_object("good", GOOD, cache=cache)
    assert compile_object("good", GOOD, host_flags() + ("-DX=1",), cache=cache) != base
    assert compile_object("good", GOOD + "\n", cache=cache) != base


def test_compile_objects_in_parallel_and_link(cache, tmp_path):
    objs = compile_objects({"a": GOOD, "b": OTHER}, cache=cache)
    assert len(objs) == 2 and all(o.is_file() for o in objs)
    so = link_shared(objs, tmp_path / "lib.so")
    lib = ctypes.CDLL(str(so))
    assert lib.answer() == 42 and lib.other(1) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_concurrent_compiles_of_one_source_agree(cache):
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        compile_object("same", OTHER, cache=cache))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and results[0].is_file()
    leftovers = [p for p in results[0].parent.iterdir() if p.suffix == ".tmp"]
    assert leftovers == []


def test_build_shared_library(cache, tmp_path):
    so = build_shared_library({"good": GOOD}, tmp_path / "x.so", cache=cache)
    assert ctypes.CDLL(str(so)).answer() == 42


def test_syntax_error_reports_command_first_error_and_log(cache):
    with pytest.raises(ToolchainError) as info:
        compile_object("broken", "int f(void) { return 1 +; }\n", cache=cache)
    msg = str(info.value)
    assert "\n" not in msg
    assert "gcc compiling broken failed" in msg
    assert "error" in msg and "reproduce: " in msg and " -c " in msg and "-O3" in msg
    log = msg.split("full log: ")[1]
    assert log.endswith("broken.log")
    with open(log) as f:
        assert "expected expression" in f.read()
    assert open(log[: -len(".log")] + ".c").read().startswith("int f(void)")


def test_missing_compiler(cache):
    with pytest.raises(ToolchainError, match="not found: install gcc"):
        compile_object("good", GOOD, cc="hidetc-no-such-gcc", cache=cache)


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HIDETC_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    assert BuildCache().root == tmp_path / "c"
    monkeypatch.delenv("HIDETC_CACHE_DIR")
    assert default_cache_dir().parts[-2:] == (".cache", "hidetc")


def test_cache_key_parts_do_not_run_together():
    assert cache_key(["ab", "c"]) != cache_key(["a", "bc"])
    assert cache_key(["x"]) == cache_key([b"x"])
