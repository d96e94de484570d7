"""Generated gRPC stubs (committed; regenerate with scripts/gen_protos.sh, checked by scripts/check_protos.sh)."""
