"""Help rendering fix for typer 0.29: every flag's help showed ``<bool>`` as its value.

typer's rich help prints ``display_type_rich`` for every option, and for a boolean flag (which
takes no value: ``--rejudge``, ``--help``) that is ``<bool>``, as if one had to write
``--rejudge true``. A flag shows no metavar; options that take a value are unchanged.
Imported by flows/cli.py before any command is built.
"""

from __future__ import annotations

from typer.core import TyperOption

_display_type_rich = TyperOption.display_type_rich


def _no_metavar_for_flags(self: TyperOption, ctx) -> str | None:
    if self.is_flag and not self.count:
        return None
    return _display_type_rich(self, ctx)


TyperOption.display_type_rich = _no_metavar_for_flags  # type: ignore[method-assign]
