"""echo-bundle against a local wheel set: what it carries, what it leaves, the slimmed sglang, the manifest."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile

from .wheelset import SO_NAME


def _carried(built) -> dict[str, str]:
    return {w["name"]: w["version"] for w in built.manifest["wheels"]}


def test_carries_the_transitive_closure_and_nothing_the_host_has(built):
    assert _carried(built) == {
        "sglang": "0.5.23",
        "alpha": "1.0",
        "epsilon": "0.5",
        "eta": "1.0",
        "zeta": "1.0",
        "omega": "1.0",
    }
    files = sorted(p.name for p in (built.unpacked / "echo-bundle" / "wheels").iterdir())
    assert files == sorted(w["file"] for w in built.manifest["wheels"])
    assert not any(
        f.startswith(("torch", "transformers", "beta", "flashinfer", "unlisted", "gamma", "delta")) for f in files
    )


def test_why_each_wheel_is_there(built):
    why = {w["name"]: w["why"] for w in built.manifest["wheels"]}
    assert why["eta"] == ["alpha 1.0: eta", "epsilon 0.5: eta<2"]  # eta 2.0 was replaced once epsilon said <2
    assert why["zeta"] == ['epsilon 0.5: zeta; extra == "fast"']
    assert why["alpha"] == ["requirements-sglang.txt: alpha==1.0", "sglang 0.5.23: alpha>=1.0"]
    assert why["omega"] == ["requirements-sglang.txt: omega"]


def test_host_packages_and_dropped_requirements_are_reported(built):
    host = {h["name"]: h for h in built.manifest["host"]}
    assert host["beta"]["status"] == "ok" and host["beta"]["host_version"] == "1.0"
    assert host["torch"]["status"] == "mismatch" and host["torch"]["host_version"] == "2.11.0"
    assert host["transformers"]["status"] == "missing"
    assert host["kappa"]["status"] == "unknown" and host["kappa"]["wanted"] == ">=1"
    assert "WARNING: not on the host and never bundled: transformers" in built.stdout
    assert "torch 2.11.0 (==9.9)" in built.stdout
    dropped = {d["requirement"].split(": ", 1)[1]: d["why"] for d in built.manifest["dropped"]}
    assert set(dropped) == {"flashinfer_python[cu13]==0.7.2", "unlisted-lib"}
    assert "FlashInfer" in dropped["flashinfer_python[cu13]==0.7.2"]
    assert "not in requirements-sglang.txt" in dropped["unlisted-lib"]


def test_build_backend_resolves_against_an_empty_host(built):
    # backend-helper is on the host list, but pip's isolated build environment cannot see the host.
    assert {w["name"] for w in built.manifest["build_wheels"]} == {"backend-tool", "backend-helper"}
    assert sorted(p.name for p in (built.unpacked / "echo-bundle" / "build").iterdir()) == [
        "backend_helper-1.0-py3-none-any.whl",
        "backend_tool-1.0-py3-none-any.whl",
    ]


def test_sglang_is_slimmed_into_a_valid_wheel(built):
    wheel = next((built.unpacked / "echo-bundle" / "wheels").glob("sglang-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        record = list(csv.reader(io.StringIO(zf.read("sglang-0.5.23.dist-info/RECORD").decode())))
        contents = {n: zf.read(n) for n in names}
    assert {"sglang/launch_server.py", "sglang/srt/keep.py", "sglang-0.5.23.dist-info/METADATA"} <= names
    assert not any(n.startswith(("sglang/multimodal_gen/", "sglang/test/")) for n in names) and SO_NAME not in names
    listed = {row[0] for row in record}
    assert listed == names
    for path, digest, size in record:
        if path.endswith("RECORD"):
            continue
        data = contents[path]
        assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert int(size) == len(data)
    slim = built.manifest["slimmed"]
    assert slim["removed_files"] == 4 and [r["files"] for r in slim["rules"]] == [1, 2, 1]


def test_sizes_and_hashes_in_the_manifest_match_the_files(built):
    archive = built.out / "echo-bundle.tar.xz"
    assert built.manifest["archive"]["bytes"] == archive.stat().st_size
    assert built.manifest["archive"]["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert f"{archive.stat().st_size / 2**20:.1f} MiB" in built.stdout.splitlines()[0]
    for row in built.manifest["wheels"]:
        path = built.unpacked / "echo-bundle" / "wheels" / row["file"]
        assert row["size"] == path.stat().st_size and row["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    inner = (built.unpacked / "echo-bundle" / "manifest.json").read_text()
    assert '"archive"' not in inner and '"wheels"' in inner


def test_prints_the_host_install_line_with_no_deps(built):
    line = built.stdout.strip().splitlines()[-1].strip()
    archive = built.out / "echo-bundle.tar.xz"
    assert line.startswith(f"tar -xJf {archive} -C /tmp && python3 /tmp/echo-bundle/install.py")
    assert "pip install -q --no-deps --no-index --find-links /tmp/echo-bundle/build -e ." in line
    assert line == built.manifest["install"]
