"""The snapshot gate: hot-load snapshot formats and the validator an exporter runs before upload.

- `layout`, `safetensors_io`, `dtypes`, `fp8`, `arc2`: reading and writing the files;
- `build`: making snapshots (export a checkpoint, ARC2 diffs, LoRA, FP8);
- `validate`: every SNAP clause as a check;
- `tiny_moe`, `cases`, `broken`: the tiny reference base, valid cases of every kind, and a
  broken variant per SNAP clause.
"""
