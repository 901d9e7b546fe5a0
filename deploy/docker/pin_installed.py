"""Print ``name==version`` for every distribution installed in this interpreter.

runtime.Dockerfile uses it as a pip constraints file, so that installing talaria on top of the
vLLM image cannot move vLLM, torch or anything else the image ships (the same idea as
scripts/vllm-venv.sh's torch constraint).
"""

from __future__ import annotations

from importlib.metadata import distributions


def main() -> None:
    pins: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if name:
            pins.setdefault(name.lower().replace("_", "-"), dist.version)
    for name in sorted(pins):
        print(f"{name}=={pins[name]}")


if __name__ == "__main__":
    main()
