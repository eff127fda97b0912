"""The wheel ships the product only: the local cluster (slurm/localcluster) and the tests' NVML stand-in
(tests/harness) are harnesses run from the checkout, and no product module imports them."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_product_and_no_test_harness(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy of what the build reads: setuptools leaves build/ beside the source
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "supervisor", "slurm"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (ROOT / name).is_dir() else {}))  # fmt: skip
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, timeout=240, cwd=tmp_path)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert "supervisor/driver/loop.py" in modules and "slurm/cli_backend.py" in modules
    assert "supervisor/client/api.py" in modules and "slurm/srun.py" in modules
    assert not [n for n in modules if n.startswith(("slurm/localcluster/", "tests/"))], modules
    assert not [n for n in modules if "recorded" in n or "harness" in n], modules


def test_no_product_module_imports_the_local_cluster() -> None:
    for path in [*ROOT.glob("supervisor/**/*.py"), *ROOT.glob("slurm/*.py")]:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []  # fmt: skip
            assert not [n for n in names if n.startswith("slurm.localcluster")], f"{path} imports {names}"
