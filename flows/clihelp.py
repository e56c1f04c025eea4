"""Help rendering fixes for typer 0.29, imported by flows/cli.py before any command is built.

- Every flag's help showed ``<bool>`` as its value: typer's rich help prints
  ``display_type_rich`` for every option, and for a boolean flag (which takes no value:
  ``--rejudge``, ``--help``) that is ``<bool>``, as if one had to write ``--rejudge true``. A flag
  shows no metavar; options that take a value are unchanged.
- The usage line showed a required argument in braces, ``{file}`` or ``{MODEL}``, which reads
  like a template placeholder: it shows ``FILE`` / ``MODEL`` (``[NAME]`` when optional).
- A group's command list kept the line breaks of a multi-line docstring's first paragraph, so a
  summary broke mid-sentence at the docstring's margin: its lines are joined, as in the
  command's own help.
"""

from __future__ import annotations

from typer import rich_utils
from typer.core import TyperArgument, TyperOption

_display_type_rich = TyperOption.display_type_rich


def _no_metavar_for_flags(self: TyperOption, ctx) -> str | None:
    if self.is_flag and not self.count:
        return None
    return _display_type_rich(self, ctx)


def _usage_name(self: TyperArgument) -> str:
    name = self.display_name_raw if self.metavar else self.display_name_raw.upper()
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


_make_command_help = rich_utils._make_command_help


def _summary_on_one_line(*, help_text: str, markup_mode):
    import inspect

    first, sep, rest = inspect.cleandoc(help_text).partition("\n\n")
    if not first.startswith("\b"):
        first = " ".join(first.split())
    return _make_command_help(help_text=first + sep + rest, markup_mode=markup_mode)


TyperOption.display_type_rich = _no_metavar_for_flags  # type: ignore[method-assign]
TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]
rich_utils._make_command_help = _summary_on_one_line  # type: ignore[assignment]
