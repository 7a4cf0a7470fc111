"""Builders of ops named by the install docs' ``DS_BUILD_*`` switches that this build does not
implement natively. Each says why in ``incompatible_reason`` (shown by ``ds_report``; a
``DS_BUILD_<NAME>=1`` install skips it with that reason) and what does the op's job instead, and
``load()`` raises ``OpBuildError`` with the same text: none pretends to build.
"""
from .builder import OpBuilder, OpBuildError


class UnavailableOpBuilder(OpBuilder):
    """Subclasses set NAME, BUILD_VAR and REASON (why, and what runs instead)."""

    REASON = ""

    def sources(self):
        return []

    def is_installed(self):
        return False

    def is_compatible(self, verbose=False):
        self.incompatible_reason = self.REASON
        if verbose:
            from deepspeed.utils.logging import logger

            logger.warning("%s is not compatible: %s", self.NAME, self.REASON)
        return False

    def load(self, verbose=True):
        raise OpBuildError(f"op '{self.NAME}' is not available: {self.REASON}")

    def jit_load(self, verbose=True):
        return self.load(verbose=verbose)

    def builder(self):
        return self.load()


class CCLCommBuilder(UnavailableOpBuilder):
    NAME = "deepspeed_ccl_comm"
    BUILD_VAR = "DS_BUILD_CCL_COMM"
    REASON = ("this build has no native oneCCL op: CPU collectives run through deepspeed.comm on "
              "torch.distributed's backend instead (the CPU accelerator picks 'ccl' when "
              "oneccl_bindings_for_pytorch is installed, else 'gloo')")


class RandomLTDBuilder(UnavailableOpBuilder):
    NAME = "random_ltd"
    BUILD_VAR = "DS_BUILD_RANDOM_LTD"
    REASON = ("random-LTD's token gather/scatter runs as torch gather/scatter (one kernel each "
              "on every device) in deepspeed.data_efficiency.random_ltd; there is no separate "
              "native op to build")
