"""What the common Xid codes mean (NVIDIA's "Xid Errors" catalogue, docs.nvidia.com/deploy/xid-errors)
and which ones make a node unfit for new work.

fatal: the GPU or its memory is broken until a reset or a reboot: the node is drained and a
managed job on it recovered elsewhere. warning: usually the application's own fault (a bad
kernel, an illegal address) or a recoverable event: reported, the node keeps working.
"""

from __future__ import annotations

MEANINGS: dict[int, str] = {
    13: "Graphics Engine Exception (usually the application: out-of-range access, illegal instruction)",
    31: "GPU memory page fault (usually the application: an illegal address)",
    43: "GPU stopped processing (the application hit a fault and was stopped)",
    45: "Preemptive cleanup, due to a previous error (a process was killed)",
    48: "Double Bit ECC Error (uncorrectable memory error)",
    63: "ECC page retirement or row remapping recorded (takes effect at the next GPU reset)",
    64: "ECC page retirement or row remapping failure (the memory cannot be repaired)",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error (the affected application was stopped)",
    95: "Uncontained ECC error (every application on the GPU is affected)",
    119: "GSP RPC timeout",
    120: "GSP error",
}
DEFAULT_FATAL = (48, 64, 74, 79, 95, 119, 120)


def meaning(code: int) -> str:
    return MEANINGS.get(code, "unknown Xid (see NVIDIA's Xid catalogue)")
