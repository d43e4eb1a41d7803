"""TE-FL's plugin API on tefl: ``from tefl.plugin.core import OpRegistry, OpManager, OpImpl,
BackendImplKind`` (see ``tefl.plugin.core``)."""
