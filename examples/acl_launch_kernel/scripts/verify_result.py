#!/usr/bin/env python3
"""Compares the sample's output with the golden file: at most 0.1% of the fp16 values may
differ by more than rtol 1e-3 (atol 1e-5)."""
import sys

import numpy as np

RELATIVE_TOL = 1e-3
ABSOLUTE_TOL = 1e-5
ERROR_TOL = 1e-3
MAX_REPORTED = 100


def verify_result(output_path, golden_path):
    output = np.fromfile(output_path, dtype=np.float16).reshape(-1)
    golden = np.fromfile(golden_path, dtype=np.float16).reshape(-1)
    if output.size != golden.size:
        print(f"[ERROR] {output_path} holds {output.size} values, {golden_path} {golden.size}")
        return False
    close = np.isclose(output, golden, rtol=RELATIVE_TOL, atol=ABSOLUTE_TOL, equal_nan=True)
    mismatches = np.where(~close)[0]
    for index in mismatches[:MAX_REPORTED]:
        expected = float(golden[index])
        actual = float(output[index])
        rdiff = abs(actual - expected) / max(abs(expected), 1e-12)
        print(f"data index: {index:06d}, expected: {expected:-.9f}, actual: {actual:-.9f}, rdiff: {rdiff:-.6f}")
    error_ratio = float(mismatches.size) / golden.size
    print(f"error ratio: {error_ratio:.4f}, tolerance: {ERROR_TOL:.4f}")
    return error_ratio <= ERROR_TOL


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: verify_result.py OUTPUT GOLDEN")
        sys.exit(2)
    if not verify_result(sys.argv[1], sys.argv[2]):
        print("[FAILURE] result error")
        sys.exit(1)
    print("[SUCCESS] result correct")
