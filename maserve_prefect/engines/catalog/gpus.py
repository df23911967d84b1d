"""GPU catalog: datasheet peaks that the roofline step model divides by.

One idea: a device is four numbers — memory, peak dense 16-bit tensor FLOPS, memory bandwidth
and the links weights and activations travel over — plus fitted efficiency factors that say how
much of those peaks real kernels reach (`engines/catalog/efficiency.py`). Peaks here are the
vendors' datasheet figures, *dense* (no 2:4 sparsity), BF16 (FP16 on V100, which lacks BF16).

Memory is the total capacity `nvidia-smi` reports (MiB), which is what
`gpu_memory_utilization` multiplies in vLLM.

Sources:
- V100-32GB SXM2: NVIDIA Tesla V100 datasheet — 125 TFLOPS tensor FP16, 900 GB/s HBM2,
  NVLink 300 GB/s, PCIe Gen3 x16.
- A100-40GB / A100-80GB SXM: NVIDIA A100 datasheet — 312 TFLOPS BF16 dense, 1,555 / 2,039 GB/s,
  NVLink 600 GB/s, PCIe Gen4 x16.
- H100 SXM5 80GB: NVIDIA H100 datasheet — 989 TFLOPS BF16 dense (1,979 with sparsity),
  3.35 TB/s, NVLink 900 GB/s, PCIe Gen5 x16.
- H200 SXM 141GB: NVIDIA H200 datasheet — 989 TFLOPS BF16 dense, 4.8 TB/s, NVLink 900 GB/s.
- L40S 48GB: NVIDIA L40S datasheet — 362.05 TFLOPS BF16 dense (733 sparse), 864 GB/s GDDR6,
  PCIe Gen4 x16, no NVLink.
- RTX PRO 6000 Blackwell 96GB: NVIDIA product brief — 4,000 AI TOPS FP4 with sparsity, i.e.
  ~504 TFLOPS BF16 dense; 1,792 GB/s GDDR7 (512-bit, 28 Gbps); PCIe Gen5 x16.
- RTX PRO 5000 Blackwell 48GB: NVIDIA product brief — 2,142 AI TOPS FP4 with sparsity, i.e.
  ~268 TFLOPS BF16 dense; 1,344 GB/s GDDR7; PCIe Gen5 x16.
SM counts and L2 sizes (used by the attention tile/wave model, `engines/sim/cost/roofline.py`):
- V100: 80 SMs, 6 MB L2 (NVIDIA Tesla V100 GPU architecture whitepaper);
- A100: 108 SMs, 40 MB L2 (NVIDIA A100 Tensor Core GPU architecture whitepaper);
- H100 SXM5 / H200 SXM (same GH100 configuration): 132 SMs, 50 MB L2 (NVIDIA H100 Tensor Core
  GPU architecture whitepaper);
- L40S: 142 SMs, 96 MB L2 (NVIDIA Ada GPU architecture whitepaper, AD102; L40S datasheet);
- RTX PRO 6000 Blackwell: 188 SMs (24,064 CUDA cores / 128 per SM), 128 MB L2 (NVIDIA RTX
  Blackwell GPU architecture whitepaper, full GB202 L2);
- RTX PRO 5000 Blackwell: 110 SMs (14,080 CUDA cores / 128); its L2 size is not in the product
  brief, 96 MB is an assumption (a cut-down GB202), unverified.
Consumer / workstation cards often run above or below these numbers; `maserve sim calibrate`
fits a device entry from measured profiles instead of trusting the datasheet.
"""

from __future__ import annotations

from dataclasses import dataclass

from maserve_prefect.errors import ConfigError

MIB = 1 << 20
GB = 10**9
TFLOPS = 10**12


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Datasheet facts about one accelerator model.

    Examples:
        >>> gpu = builtin_gpu("h100")
        >>> gpu.mem_bw_bytes_s / 1e12 if gpu else None
        3.35
    """

    name: str
    memory_bytes: int
    peak_flops: float
    mem_bw_bytes_s: float
    interconnect_bytes_s: float  # per-GPU GPU-to-GPU bandwidth (NVLink, else PCIe)
    host_link_bytes_s: float  # host <-> device (PCIe) per direction, sustained
    interconnect: str = "pcie"
    aliases: tuple[str, ...] = ()
    # Streaming multiprocessors and L2 bytes: the attention kernel's wave width and the cache its
    # GQA query heads share KV through. Defaults (an A100-like part) only for unknown devices.
    num_sms: int = 108
    l2_bytes: int = 40 * MIB


# PCIe sustained per-direction throughput: Gen3 ~12 GB/s, Gen4 ~25 GB/s, Gen5 ~50 GB/s (about
# 80% of the 16 / 32 / 64 GB/s link rates, the usual pinned-memory cudaMemcpy figure).
_PCIE3, _PCIE4, _PCIE5 = 12 * GB, 25 * GB, 50 * GB

GPUS: tuple[GpuSpec, ...] = (
    GpuSpec(
        "V100-32GB",
        32768 * MIB,
        125 * TFLOPS,
        900 * GB,
        300 * GB,
        _PCIE3,
        "nvlink",
        ("V100", "Tesla-V100-SXM2-32GB"),
        80,
        6 * MIB,
    ),
    GpuSpec(
        "A100-40GB",
        40960 * MIB,
        312 * TFLOPS,
        1555 * GB,
        600 * GB,
        _PCIE4,
        "nvlink",
        (),
        108,
        40 * MIB,
    ),
    GpuSpec(
        "A100-80GB",
        81920 * MIB,
        312 * TFLOPS,
        2039 * GB,
        600 * GB,
        _PCIE4,
        "nvlink",
        ("A100",),
        108,
        40 * MIB,
    ),
    GpuSpec(
        "H100",
        81559 * MIB,
        989 * TFLOPS,
        3350 * GB,
        900 * GB,
        _PCIE5,
        "nvlink",
        ("H100-80GB", "H100-SXM"),
        132,
        50 * MIB,
    ),
    GpuSpec(
        "H200",
        143771 * MIB,
        989 * TFLOPS,
        4800 * GB,
        900 * GB,
        _PCIE5,
        "nvlink",
        ("H200-141GB",),
        132,
        50 * MIB,
    ),
    GpuSpec(
        "L40S", 46068 * MIB, 362.05 * TFLOPS, 864 * GB, _PCIE4, _PCIE4, "pcie", (), 142, 96 * MIB
    ),
    GpuSpec(
        "RTX PRO 6000",
        97887 * MIB,
        503.8 * TFLOPS,
        1792 * GB,
        _PCIE5,
        _PCIE5,
        "pcie",
        ("RTXPRO6000", "RTX-PRO-6000", "RTX PRO 6000 Blackwell"),
        188,
        128 * MIB,
    ),
    GpuSpec(
        "RTX PRO 5000",
        48 * 1024 * MIB,
        267.8 * TFLOPS,
        1344 * GB,
        _PCIE5,
        _PCIE5,
        "pcie",
        ("RTXPRO5000", "RTX-PRO-5000", "RTX PRO 5000 Blackwell"),
        110,
        96 * MIB,
    ),
)


def gpu_key(name: str) -> str:
    """Normalised lookup key: case, spaces, dashes and underscores do not matter."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


_BY_KEY: dict[str, GpuSpec] = {}
for _spec in GPUS:
    for _alias in (_spec.name, *_spec.aliases):
        if _BY_KEY.get(gpu_key(_alias), _spec) is not _spec:
            raise RuntimeError(f"duplicate GPU alias {_alias!r} in the catalog")
        _BY_KEY[gpu_key(_alias)] = _spec


def builtin_gpu(name: str) -> GpuSpec | None:
    """The datasheet entry for `name`, or None (user device entries are not consulted)."""
    return _BY_KEY.get(gpu_key(name))


def list_builtin_gpus() -> list[str]:
    return [g.name for g in GPUS]


def unknown_gpu_error(name: str, known: list[str]) -> ConfigError:
    return ConfigError(
        f"unknown GPU {name!r}; known GPUs: {', '.join(known)}. Fit a new device with "
        "`maserve sim calibrate PROFILE_DIR --gpu NAME --base-gpu DATASHEET_NAME`."
    )
