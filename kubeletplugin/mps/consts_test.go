package mps

const gib = int64(1) << 30
