"""Build the compiled CPU kernels now (`make` runs this): python -m agentrt.kernels.build"""

from __future__ import annotations

from agentrt.kernels import native


def main() -> None:
    path = native.build(verbose=True)
    lib = native.load()
    vnni = "yes" if lib is not None and lib.agrt_has_vnni() else "no (portable loops)"
    amx = "yes" if lib is not None and lib.agrt_has_amx() else "no"
    print(f"agentrt CPU kernels: {path} (AVX-512 VNNI: {vnni}, AMX: {amx})")


if __name__ == "__main__":
    main()
