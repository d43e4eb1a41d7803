"""``import transformer_engine_fl_torch as tex``: tefl's TEX functions (``tefl.tex``) under the
module name TE-FL's snippets import."""

from tefl.tex import *  # noqa: F401,F403
from tefl.tex import __all__  # noqa: F401
