"""FlexAttention on tpu: torch's device check lists the devices it knows and refuses others;
on tpu flex attention runs its eager implementation (score and mask functions applied to the
dense scores, with backward), so tpu inputs are let through the check."""


def install():
    try:
        import torch.nn.attention.flex_attention as flex
    except ImportError:
        return
    check = getattr(flex, "_validate_device", None)
    if check is None or getattr(check, "_lets_tpu_through", False):
        return

    def validate_device(query, key, value):
        if query.device.type == "tpu":
            return None
        return check(query, key, value)

    validate_device._lets_tpu_through = True
    flex._validate_device = validate_device
