from flash_attn import _cuda_only

all_gather = _cuda_only
