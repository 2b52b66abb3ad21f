"""A small local wheel set for echo-bundle's tests: hand-made wheels with dependencies between them.

The graph (what a correct build of it must carry):

    sglang 0.5.23 (this interpreter's binary tag; multimodal_gen/, test/, a fake compiled extension)
      -> alpha>=1.0            runtime file pins alpha==1.0 (alpha 2.0 exists)
           -> epsilon[fast]>=0.5 -> zeta (only with extra "fast"), eta<2
           -> eta                 (eta 2.0 exists: eta 1.0 only once epsilon's eta<2 is known)
      -> beta                  on the host
      -> kappa>=1              on the host (version unknown), not in the runtime file: the host's, not "dropped"
      -> torch==9.9            host-only (the host has 2.11.0; a torch 9.9 wheel is on offer)
      -> transformers==9.9     host-only, not on the host
      -> flashinfer_python[cu13]==0.7.2, unlisted-lib   not in the runtime file: dropped
      -> zeta                  not in the runtime file either, but carried through epsilon: not "dropped"
      -> gamma; extra == "diffusion"   /   delta; python_version < "3"   never apply
    omega                      in the runtime file only
    backend-tool -> backend-helper   the fake project's [build-system] requires (a PEP 660 backend)
"""

from __future__ import annotations

from pathlib import Path

from packaging import tags

from sglang_echo.bundle.wheels import Member, write_wheel

SO_NAME = "sglang/srt/_rust_ext.cpython-3x-x86_64-linux-gnu.so"

# A PEP 660 build backend in a few lines: the editable wheel of project "proj" is one .pth naming
# the project folder. It imports backend_helper, so a build works only with its dependency there too.
BACKEND = """
import os, zipfile
import backend_helper

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name, info = "proj-0.1-py3-none-any.whl", "proj-0.1.dist-info"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        zf.writestr("proj.pth", os.getcwd() + "\\n")
        zf.writestr(info + "/METADATA", "Metadata-Version: 2.1\\nName: proj\\nVersion: 0.1\\n")
        zf.writestr(info + "/WHEEL", "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        zf.writestr(info + "/RECORD", "")
    return name
"""


def binary_tag() -> tags.Tag:
    """This interpreter's most specific Linux binary tag (e.g. cp311-cp311-manylinux_2_36_x86_64)."""
    return next(t for t in tags.sys_tags() if t.platform.startswith(("manylinux", "musllinux", "linux_")))


def make_wheel(
    folder: Path,
    name: str,
    version: str,
    requires: tuple[str, ...] = (),
    extras: tuple[str, ...] = (),
    files: dict[str, bytes] | None = None,
    tag: str = "py3-none-any",
) -> Path:
    """A minimal valid wheel; by default one module ``<name>/__init__.py`` holding ``VERSION``."""
    dist = name.replace("-", "_")
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Provides-Extra: {e}" for e in extras),
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    wheel = [
        "Wheel-Version: 1.0",
        "Generator: tests",
        f"Root-Is-Purelib: {str(tag.endswith('-any')).lower()}",
        f"Tag: {tag}",
    ]
    files = files if files is not None else {f"{dist}/__init__.py": f"VERSION = {version!r}\n".encode()}
    members = [Member(path, data) for path, data in files.items()]
    members += [
        Member(f"{dist}-{version}.dist-info/METADATA", ("\n".join(meta) + "\n").encode()),
        Member(f"{dist}-{version}.dist-info/WHEEL", ("\n".join(wheel) + "\n").encode()),
    ]
    return write_wheel(folder / f"{dist}-{version}-{tag}.whl", members)


def sglang_files() -> dict[str, bytes]:
    return {
        "sglang/__init__.py": b"",
        "sglang/launch_server.py": b"import alpha\nimport eta\nREADY = (alpha.VERSION, eta.VERSION)\n",
        "sglang/srt/__init__.py": b"",
        "sglang/srt/keep.py": b"KEPT = True\n",
        "sglang/multimodal_gen/__init__.py": b"raise ImportError('diffusion')\n",
        "sglang/test/__init__.py": b"",
        "sglang/test/test_utils.py": b"X = 1\n",
        SO_NAME: b"\x7fELF not really a shared object",
    }


def build_wheelset(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tag = str(binary_tag())
    make_wheel(
        folder,
        "sglang",
        "0.5.23",
        tag=tag,
        files=sglang_files(),
        requires=(
            "alpha>=1.0",
            "beta",
            "kappa>=1",
            "torch==9.9",
            "transformers==9.9",
            "flashinfer_python[cu13]==0.7.2",
            "unlisted-lib",
            "zeta",
            'gamma; extra == "diffusion"',
            'delta; python_version < "3"',
        ),
        extras=("diffusion",),
    )
    make_wheel(folder, "alpha", "1.0", requires=("epsilon[fast]>=0.5", "eta"))
    make_wheel(folder, "alpha", "2.0")
    make_wheel(folder, "epsilon", "0.5", requires=('zeta; extra == "fast"', "eta<2"), extras=("fast",))
    for name, version in (
        ("eta", "1.0"),
        ("eta", "2.0"),
        ("zeta", "1.0"),
        ("omega", "1.0"),
        ("beta", "1.0"),
        ("torch", "9.9"),
        ("torch", "2.11.0"),
        ("transformers", "9.9"),
        ("flashinfer-python", "0.7.2"),
        ("unlisted-lib", "1.0"),
        ("gamma", "1.0"),
        ("delta", "1.0"),
        ("backend-helper", "1.0"),
    ):
        make_wheel(folder, name, version)
    make_wheel(
        folder,
        "backend-tool",
        "1.0",
        requires=("backend-helper",),
        files={"backend_tool/__init__.py": BACKEND.encode()},
    )
    return folder


def write_inputs(root: Path) -> dict[str, Path]:
    """The runtime file, the host list and the fake project beside the wheel set."""
    root.mkdir(parents=True, exist_ok=True)
    runtime = root / "requirements-sglang.txt"
    runtime.write_text("# the CPU runtime\nalpha==1.0\nomega\nbeta\ntorch==9.9\n")
    host = root / "host.txt"
    host.write_text("# a host\nbeta==1.0\nkappa\ntorch==2.11.0\nbackend-helper\n")
    project = root / "project"
    project.mkdir(exist_ok=True)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["backend-tool>=1"]\nbuild-backend = "backend_tool"\n'
    )
    (project / "projmod.py").write_text("WHERE = 'the project folder'\n")
    return {"runtime": runtime, "host": host, "project": project}
