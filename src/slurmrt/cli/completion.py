"""``slurmrt completion SHELL``: a completion script for bash or zsh, generated from the command line's own parser.

Completes the commands and each command's options; arguments and everything after ``--`` complete as file names.
No completion library: the script is plain shell written from the parser at hand (so it is never out of date with
the installed slurmrt), and a completion never starts Python. Install it once:

    bash: echo 'eval "$(slurmrt completion bash)"' >> ~/.bashrc
    zsh:  echo 'eval "$(slurmrt completion zsh)"' >> ~/.zshrc     (after compinit)
"""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_command


def run(args: argparse.Namespace) -> int:
    commands = _commands(args.parser)  # the whole command line's parser (cli.main sets it)
    print(bash(commands) if args.shell == "bash" else zsh(commands))
    return 0


def _commands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, list[str]]]:
    """Each sub-command's (one-line help, option strings)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                options = sorted(o for a in sub._actions for o in a.option_strings)
                found[name] = (helps.get(name, ""), options)
    return found


def bash(commands: dict[str, tuple[str, list[str]]]) -> str:
    cases = "\n".join(f"        {name}) opts='{' '.join(options)}' ;;" for name, (_, options) in commands.items())
    return f"""# slurmrt completion for bash: eval "$(slurmrt completion bash)"
_slurmrt() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} cmd="" opts="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${{COMP_WORDS[i]}} in
            --) return ;;  # the command slurmrt runs: file names (complete -o default)
            -*) ;;
            *) [ -z "$cmd" ] && cmd=${{COMP_WORDS[i]}} ;;
        esac
    done
    if [ -z "$cmd" ]; then
        COMPREPLY=($(compgen -W "{' '.join(commands)} --help --version" -- "$cur"))
        return
    fi
    case $cmd in
{cases}
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    fi
}}
complete -o default -F _slurmrt slurmrt"""


def zsh(commands: dict[str, tuple[str, list[str]]]) -> str:
    described = "\n".join(f"        {_zsh_quote(f'{name}:{text}')}" for name, (text, _) in commands.items())
    cases = "\n".join(f"        {name}) opts=({' '.join(options)}) ;;" for name, (_, options) in commands.items())
    return f"""# slurmrt completion for zsh: eval "$(slurmrt completion zsh)" (after compinit)
_slurmrt() {{
    local -a commands opts
    commands=(
{described}
    )
    if (( CURRENT == 2 )); then
        _describe 'command' commands
        compadd -- --help --version
        return
    fi
    if (( ${{words[(I)--]}} && ${{words[(I)--]}} < CURRENT )); then
        _files
        return
    fi
    case $words[2] in
{cases}
    esac
    if [[ $PREFIX == -* ]]; then
        compadd -- $opts
    else
        _files
    fi
}}
compdef _slurmrt slurmrt"""


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def add_parser(sub: Any) -> None:
    p = add_command(sub, "completion", run, doc=__doc__, help="print a completion script for bash or zsh",
                    epilog="examples:\n  eval \"$(slurmrt completion bash)\"   (in ~/.bashrc)\n"
                           "  eval \"$(slurmrt completion zsh)\"    (in ~/.zshrc, after compinit)")
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
