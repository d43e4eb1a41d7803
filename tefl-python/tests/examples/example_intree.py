from tefl.plugin.core import (
    OpRegistry, OpManager, OpImpl, BackendImplKind
)

# 1. Define your operator implementation
def my_rmsnorm(input, weight, eps=1e-5, **kwargs):
    variance = input.pow(2).mean(-1, keepdim=True)
    return input * torch.rsqrt(variance + eps) * weight, torch.rsqrt(variance + eps)

# 2. Register to Registry
registry = OpRegistry()
registry.register_impl(OpImpl(
    op_name="rmsnorm_fwd",
    impl_id="vendor.mybackend",
    kind=BackendImplKind.VENDOR,
    vendor="mybackend",
    fn=my_rmsnorm,
    priority=200,
))

# 3. Call via Manager
manager = OpManager(registry)
output, rsigma = manager.call("rmsnorm_fwd", input, weight)
