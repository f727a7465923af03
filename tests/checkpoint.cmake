# Checkpoint files through the aio handle vs plain I/O (byte-identical files, bit-identical resume)
# and the aio file layer under them: CPU tests.
cutrain_add_test(NAME test_checkpoint_io LABEL cpu SOURCES unit/test_checkpoint_io.cpp LIBS cutrain_model)
# Through the `cutrain` binary: cpu = checkpoint files identical for CUTRAIN_CHECKPOINT_IO=plain/aio
# and resume; cuda = configs/bf16_full_nvme_optimizer.json trains like bf16_full (skipped without a GPU).
cutrain_add_cli_test(nvme_cli nvme_cli.sh)
