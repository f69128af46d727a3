"""Attention kernels without a double backward (PyTorch's SDPA flash and memory-efficient
kernels, FlashAttention) make an exact HVP fail: the failure is reported naming the module."""


class AttentionDoubleBackwardError(RuntimeError):
    pass


_MARKERS = ("scaled_dot_product", "flash_attention", "efficient_attention", "_flash_",
            "flash_attn")


def attention_modules(model):
    """(name, implementation) of the modules that run SDPA or flash attention, by the model's
    Hugging Face config or the module's own attribute."""
    found = []
    for name, module in model.named_modules():
        config = getattr(module, "config", None)
        impl = getattr(config, "_attn_implementation", None) if config is not None else None
        if "attention" in type(module).__name__.lower() and impl not in (None, "eager"):
            found.append((name, impl))
        elif getattr(module, "flash", False) is True:  # nanoGPT's CausalSelfAttention
            found.append((name, "flash"))
    return found


def explain(error, model):
    """An AttentionDoubleBackwardError for `error` when it comes from such a kernel, else None."""
    text = str(error)
    if not any(m in text for m in _MARKERS):
        return None
    modules = attention_modules(model)
    where = f"module '{modules[0][0]}' ({modules[0][1]})" if modules else "an attention module"
    first_line = text.strip().splitlines()[0] if text.strip() else text
    return AttentionDoubleBackwardError(
        f"{where} runs an attention kernel without a double backward ({first_line}): load the "
        f"model with attn_implementation=\"eager\" (nanoGPT: flash = False), or use "
        f"hvp=curv.HvpMethod.FINITE_DIFFERENCE")
