from flash_attn import _cuda_only

index_first_axis = pad_input = rearrange = unpad_input = _cuda_only
