"""`hpctrain install horovod`: the plan from what the environment offers, and the patches (pure)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpctrain.install.horovod import Found, InstallError, compiler, install, patched, plan

FULL = Found(
    "cp312",
    "2.6.0+cu124",
    "12.4",
    "/usr/bin/c++",
    "/usr/bin/cmake",
    "/opt/ompi/bin/mpicxx",
    "/cuda/bin/nvcc",
    None,
)


def test_a_cuda_torch_with_nvcc_and_mpi_builds_nccl_with_mpi_into_a_key_of_torch_and_python() -> None:
    p = plan(FULL, "auto", Path("/c"), env={})
    assert p.env["HOROVOD_WITH_MPI"] == "1" and p.env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert p.wheel_dir == Path("/c/wheels/horovod-0.28.1_torch-2.6.0_cu124_cp312_nccl") and not p.notes
    assert "HOROVOD_GPU_OPERATIONS" not in plan(FULL, "none", Path("/c"), env={}).env


def test_without_mpi_it_builds_gloo_only_and_says_how_to_get_mpi() -> None:
    cpu = Found("cp311", "2.13.0+cpu", None, "/usr/bin/g++", "/usr/bin/cmake", None, None, None)
    p = plan(cpu, "auto", Path("/c"), env={})
    assert p.env["HOROVOD_WITHOUT_MPI"] == "1" and "HOROVOD_WITH_MPI" not in p.env
    # issue 72 class 3: the key ignored MPI, so a Gloo-only plan installed the cached MPI wheel
    assert p.wheel_dir.name == "horovod-0.28.1_torch-2.13.0_cpu_cp311_cpu_gloo-only"
    assert "module load openmpi" in p.notes[0]
    with_mpi = plan(dataclasses.replace(cpu, mpicxx="/usr/bin/mpicxx"), "auto", Path("/c"), env={})
    assert with_mpi.wheel_dir.name == "horovod-0.28.1_torch-2.13.0_cpu_cp311_cpu"  # setup.sh's key, kept


def test_every_missing_tool_is_named_with_where_clusters_keep_it() -> None:
    bare = Found("cp311", "2.6.0+cu124", "12.4", None, None, None, None, None)
    p = plan(bare, "auto", Path("/c"), env={})  # a cached wheel would still install
    with pytest.raises(InstallError) as e:
        p.buildable()
    text = str(e.value)
    assert "module load gcc" in text and '"cmake<4"' in text and "module load cuda" in text


def test_the_patches_apply_to_horovods_text_and_refuse_another() -> None:
    torch_cmake = (
        'set(CMAKE_CXX_STANDARD 14)\nexecute_process(COMMAND ${PY_EXE} -c "from distutils.sysconfig '
        'import get_python_inc; print(get_python_inc())")\n'
    )
    out = patched("horovod/torch/CMakeLists.txt", torch_cmake)
    assert "CMAKE_CXX_STANDARD 17" in out and "distutils" not in out and "sysconfig.get_paths()" in out
    js = "import os\nfrom distutils.spawn import find_executable\n"
    assert (
        patched("horovod/runner/js_run.py", js) == "import os\nfrom shutil import which as find_executable\n"
    )
    with pytest.raises(InstallError, match="not the sdist these patches fit"):
        patched("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 17)\n")


def test_an_sdist_member_that_would_land_outside_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Pythons before 3.11.4 (Debian 12's 3.11.2) have no extraction filter: unpack checks itself."""
    import io
    import tarfile

    from hpctrain.install import horovod

    def sdist(name: str, member: str) -> Path:
        path = tmp_path / name
        with tarfile.open(path, "w:gz") as tar:
            info = tarfile.TarInfo(member)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
        return path

    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    (tmp_path / "in").mkdir()
    horovod.unpack(sdist("good.tar.gz", "horovod-0.28.1/setup.py"), tmp_path / "in")
    assert (tmp_path / "in" / "horovod-0.28.1" / "setup.py").read_text() == "hi"
    with pytest.raises(InstallError, match="would land outside"):
        horovod.unpack(sdist("bad.tar.gz", "../escaped.txt"), tmp_path / "in")
    assert not (tmp_path / "escaped.txt").exists()


def test_nccl_for_a_cpu_torch_is_refused_and_a_cxx_with_flags_is_a_compiler() -> None:
    """Issue 72 class 8: --gpu nccl was accepted for a CPU torch; CXX="g++ -O2" was no compiler."""
    cpu = Found("cp311", "2.13.0+cpu", None, "/usr/bin/g++", "/usr/bin/cmake", "/usr/bin/mpicxx", None, None)
    with pytest.raises(
        InstallError, match=r"--gpu nccl needs a CUDA build of torch; this one \(2.13.0\+cpu\)"
    ):
        plan(cpu, "nccl", Path("/c"), env={}).buildable()
    assert compiler({"CXX": "g++ -O2 -std=c++17"}) == "g++"
    assert compiler({"CXX": "ccache /opt/gcc/bin/g++"}) == "/opt/gcc/bin/g++"
    assert compiler({"CXX": "  "}) == compiler({})  # blank: as unset


def test_only_a_wheel_its_manifest_vouches_for_is_installed_from_the_cache(tmp_path: Path) -> None:
    """Issue 72 class 3: a wheel planted under the expected name installed, and its code ran in
    hpctrain's post-install check; a planted horovod-9.9.9 beside the real one was the one installed
    (the highest name won); a Gloo-only plan installed the cached MPI wheel; a damaged one ended in
    pip's error. Now only a wheel whose manifest (written with it, published with it) names it, its
    sha256 and this plan's switches is installed; anything else is built again, and `install` of
    it is refused naming the file before pip or its code runs."""
    import sys
    import zipfile

    from hpctrain.install.wheel_cache import write_manifest

    cpu = Found("cp311", "2.13.0+cpu", None, "/usr/bin/g++", "/usr/bin/cmake", "/usr/bin/mpicxx", None, None)
    p = plan(cpu, "auto", tmp_path, env={})
    p.wheel_dir.mkdir(parents=True)
    real = p.wheel_dir / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(real, "w") as z:
        z.writestr("horovod/__init__.py", "open('/tmp/pwned', 'w')\n")
    (p.wheel_dir / "horovod-9.9.9-cp311-cp311-linux_x86_64.whl").write_bytes(b"planted")
    (p.wheel_dir / "horovod-0.28.1-cp312-cp312-linux_x86_64.whl").write_bytes(b"another python's")
    assert p.cache_state() == (
        None,
        f"{real} has no manifest (manifest.json): hpctrain did not build it, or built it before manifests",
    )
    with pytest.raises(
        InstallError, match=r"has no manifest .* `hpctrain install horovod --rebuild` builds it"
    ):
        install(p, sys.executable)  # refused before pip: nothing of the wheel ran
    write_manifest(p.wheel_dir, real, p.env)  # as a build leaves it
    assert p.cached and p.wheel() == real  # by its name, not the highest version's
    gloo_only = dataclasses.replace(p, env={**p.env, "HOROVOD_WITHOUT_MPI": "1"})
    assert "was built with other switches" in gloo_only.cache_state()[1]
    with real.open("r+b") as f:  # damaged (or replaced) after it was built
        f.seek(40)
        f.write(b"\0\0\0\0")
    assert p.cache_state() == (None, f"{real} does not match its manifest's sha256 (damaged or replaced)")
    (p.wheel_dir / "manifest.json").write_text("x" * 100_000)  # no manifest hpctrain writes is this long
    assert "is larger than any manifest hpctrain writes" in p.cache_state()[1]
    (p.wheel_dir / "horovod-0.28.1-cp311-cp311-manylinux_x86_64.whl").write_bytes(b"two")
    assert "holds 2 wheels" in p.cache_state()[1]


def test_an_interrupted_build_is_an_interrupt_and_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    """Issue 72 class 8: Ctrl-C of a build was reported as "Horovod's build failed" (exit 3), and
    SIGTERM left an empty staging directory in the cache. The build's process dying of a signal
    (a real child, killed by SIGTERM as a terminal's Ctrl-C kills the compilers with it) is an
    interrupt; a staged build that ends any way but whole leaves the cache as it was."""
    import sys

    from hpctrain.install.horovod import compile_wheel, staged

    cpu = Found("cp311", "2.13.0+cpu", None, "/usr/bin/g++", "/usr/bin/cmake", "/usr/bin/mpicxx", None, None)
    p = plan(cpu, "auto", tmp_path / "cache", env={})
    src, log = tmp_path / "src", tmp_path / "build.log"
    src.mkdir()
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]
    with pytest.raises(KeyboardInterrupt):
        compile_wheel(p, killed, src, tmp_path, log, lambda _: None, lambda _: None)
    failing = [sys.executable, "-c", "print('error: no compiler'); raise SystemExit(1)"]
    with pytest.raises(
        InstallError, match="Horovod's build failed; the end of its log .*\n.*error: no compiler"
    ):
        compile_wheel(p, failing, src, tmp_path, log, lambda _: None, lambda _: None)

    def interrupted(staging: Path) -> None:
        (staging / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        staged(p, interrupted)
    assert list(p.wheel_dir.parent.iterdir()) == [p.wheel_dir.parent / "horovod-0.28.1-build-failed.log"]
    staged(p, lambda staging: (staging / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"whole"))
    assert p.cached and sorted(f.name for f in p.wheel_dir.iterdir()) == [
        "horovod-0.28.1-cp311-cp311-linux_x86_64.whl",
        "manifest.json",
    ]
