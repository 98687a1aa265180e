"""Python packages for an offline GPU machine, carried as wheels: what to download here, and how the machine installs
the ones it lacks (benchmarks/gpu_check.sh runs `install`). docs/GPU_OFFLINE.md explains the steps.

The GPU machine this project uses has torch 2.11 (cu130), transformers 5.17 (and what they depend on) and Python 3.12,
no network, and takes at most 64 MiB of files per call. Two sets, one call each:
- train: what the tests and the llama-1b runs import beyond torch and transformers;
- app: what `python app.py` adds (gradio, gradio_client, their web stack, matplotlib).
As wheels the train set is 68 MiB (pyarrow alone 55 MB), over the limit: wheels are only deflate-compressed, so `pack`
stores a set's wheel contents in one .tar.xz (38.5 MiB each set), and `install` zips them back into the same wheels
before `pip install --no-index --no-deps --target`. Versions: requirements.txt's pins, and their dependencies as pip
resolved them for Python 3.12 on manylinux x86_64 next to torch 2.11 and transformers 5.17.

    python benchmarks/carried_wheels.py download train .whl/download   # here, from the registry
    python benchmarks/carried_wheels.py pack train .whl/download .whl  # here: .whl/train.tar.xz
    python benchmarks/carried_wheels.py install .whl .whl/site         # there, offline
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import lzma
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

SETS = {
    "train": [
        "trl==1.16.0", "datasets==5.2.0", "accelerate==1.15.0", "pyarrow==26.0.1", "pandas==3.1.1",
        "python-dateutil==4.0.0", "pytz==2026.6", "tzdata==2026.6", "dill==0.4.1", "multiprocess==0.70.19",
        "xxhash==4.1.0", "psutil==7.2.2", "nvidia-ml-py==13.615.71", "pytest==9.0.3", "pluggy==1.7.0",
        "iniconfig==2.3.1", "pytest-timeout==2.4.0",
    ],
    "app": [
        "gradio==6.31.0", "gradio-client==2.7.2", "hf-gradio==0.4.1", "fastapi==0.165.0", "starlette==1.10.0",
        "uvicorn==0.54.0", "orjson==3.13.0", "python-multipart==0.0.34", "safehttpx==0.1.7",
        "semantic-version==2.10.0", "tomlkit==0.14.0", "groovy==0.1.2", "pydub==0.25.1", "brotli==1.2.1",
        "opentelemetry-api==1.45.2", "matplotlib==3.11.2", "contourpy==1.4.0", "cycler==0.12.1",
        "fonttools==4.68.0", "kiwisolver==1.5.1", "pyparsing==3.3.3", "pillow==12.3.0",
    ],
}
# Every manylinux tag these wheels are published under; the machine's glibc is 2.28 or later.
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64"]
CARRY_LIMIT_BYTES = 64 * 2**20


def _distribution(wheel: Path) -> str:
    return wheel.name.split("-")[0]


def download(set_name: str, folder: Path) -> None:
    platforms = [argument for tag in PLATFORMS for argument in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps", "--python-version",
                    "3.12", "--implementation", "cp", *platforms, "--dest", str(folder), *SETS[set_name]], check=True)


def pack(set_name: str, downloads: Path, out: Path) -> Path:
    """`out/<set>.tar.xz`: one folder per wheel (named as the wheel), holding the wheel's files."""
    wanted = {requirement.split("==")[0].replace("-", "_").lower() for requirement in SETS[set_name]}
    wheels = sorted(w for w in downloads.glob("*.whl") if _distribution(w).lower() in wanted)
    if len(wheels) != len(wanted):
        raise SystemExit(f"{downloads} has {len(wheels)} of the {len(wanted)} {set_name} wheels: run download first")
    out.mkdir(parents=True, exist_ok=True)
    bundle = out / f"{set_name}.tar.xz"
    with lzma.open(bundle, "wb", preset=9) as compressed, tarfile.open(fileobj=compressed, mode="w") as tar:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.infolist():
                    if member.is_dir():
                        continue
                    info = tarfile.TarInfo(f"{wheel.name}/{member.filename}")
                    info.size = member.file_size
                    info.mtime = int(time.mktime((*member.date_time, 0, 0, -1)))
                    tar.addfile(info, io.BytesIO(archive.read(member)))
    wheel_bytes = sum(w.stat().st_size for w in wheels)
    print(f"{bundle}: {bundle.stat().st_size / 2**20:.1f} MiB (the wheels: {wheel_bytes / 2**20:.1f} MiB; a call "
          f"carries at most {CARRY_LIMIT_BYTES / 2**20:.0f} MiB)")
    return bundle


def _rezip(bundle: Path, folder: Path) -> None:
    """Writes each wheel of a bundle back to `folder` as a wheel file."""
    with tempfile.TemporaryDirectory() as scratch, tarfile.open(bundle, "r:xz") as tar:
        tar.extractall(scratch, filter="data")
        for unpacked in sorted(Path(scratch).iterdir()):
            target = folder / unpacked.name
            if target.exists():
                continue
            # strict_timestamps=False: files dated before 1980 (zip's epoch) are stored as 1980
            with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, strict_timestamps=False) as wheel:
                for path in sorted(p for p in unpacked.rglob("*") if p.is_file()):
                    wheel.write(path, path.relative_to(unpacked).as_posix())


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def install(folder: Path, site: Path) -> None:
    """Installs, offline, every carried wheel whose distribution this Python does not have (the machine's own
    packages are never replaced). Run with `site` already on PYTHONPATH, so a second call skips what the first
    installed."""
    for bundle in sorted(folder.glob("*.tar.xz")):
        _rezip(bundle, folder)
    wheels = sorted(folder.glob("*.whl"))
    missing = [w for w in wheels if not _installed(_distribution(w))]
    present = sorted({_distribution(w) for w in wheels} - {_distribution(w) for w in missing})
    print(f"carried wheels: {len(wheels)}; already installed: {', '.join(present) or 'none'}")
    if missing:
        print(f"installing into {site}: {', '.join(w.name for w in missing)}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", "--target",
                        str(site), *map(str, missing)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("download", "pack"):
        command = commands.add_parser(name)
        command.add_argument("set", choices=SETS)
        command.add_argument("folder", type=Path)
        if name == "pack":
            command.add_argument("out", type=Path)
    command = commands.add_parser("install")
    command.add_argument("folder", type=Path)
    command.add_argument("site", type=Path)
    args = parser.parse_args()
    if args.command == "download":
        download(args.set, args.folder)
    elif args.command == "pack":
        pack(args.set, args.folder, args.out)
    else:
        install(args.folder, args.site)


if __name__ == "__main__":
    main()
