#!/usr/bin/env python3
"""Inputs and golden output of the launch_kernel sample: z = x + y in fp16, 8 x 2048."""
import numpy as np


def gen_golden_data():
    x = np.random.uniform(1, 100, [8, 2048]).astype(np.float16)
    y = np.random.uniform(1, 100, [8, 2048]).astype(np.float16)
    golden = (x + y).astype(np.float16)
    x.tofile("./input/input_x.bin")
    y.tofile("./input/input_y.bin")
    golden.tofile("./output/golden.bin")


if __name__ == "__main__":
    gen_golden_data()
