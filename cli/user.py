"""``txbroker user``: add, list, delete users, set passwords, make access keys.

The commands edit the users file directly (``service/users.py``); a broker using that file
reads it again on its own, so no broker needs to be reachable or restarted.  Nothing here
prints a password, a SCRAM credential or an existing secret: ``access-key`` prints the new
secret once, because it cannot be shown again.
"""

from __future__ import annotations

import sys

import click

from txbroker.cli.common import CommandError, command_name
from txbroker.service.cluster_auth import CLUSTER_ACCESS_KEY
from txbroker.service.users import ROLES, UsersFileError, edit_users, load_users

#: The users file in the default data dir, where ``txbroker serve`` run from the same
#: directory keeps its data.
DEFAULT_USERS_FILE = "txbroker-data/users.json"

users_file_option = click.option(
    "--users-file", envvar="TXBROKER_USERS_FILE", default=DEFAULT_USERS_FILE, show_default=True,
    type=click.Path(dir_okay=False), help="The users file (env TXBROKER_USERS_FILE).")


def _fail(users_file: str, exc: Exception) -> CommandError:
    ctx = click.get_current_context(silent=True)
    if isinstance(exc, UsersFileError):  # it names the file already
        return CommandError(command_name(ctx), None, str(exc))
    return CommandError(command_name(ctx), f"users file {users_file}", str(exc))


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    return click.prompt("password", hide_input=True, confirmation_prompt=True)


@click.group()
def user() -> None:
    """Users of the broker: passwords for Kafka SASL/SCRAM, access keys for RocketMQ clients."""


@user.command()
@click.argument("name")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of stdin (default: prompt twice).")
@click.option("--role", "roles", multiple=True, type=click.Choice(ROLES),
              help="A role (repeat for several): admin, producer (publish to every topic), "
                   "consumer (subscribe and consume in every group).")
@users_file_option
def add(name: str, password_stdin: bool, roles: tuple[str, ...], users_file: str) -> None:
    """Add user NAME with a password (stored only as SCRAM-SHA-256/512 credentials)."""
    if name == CLUSTER_ACCESS_KEY:  # its password is cluster_secret (docs/security.md)
        raise _fail(users_file, ValueError(
            f"user name {name!r} is reserved: it is the account brokers log in to each "
            f"other's Kafka ports with, its password is the cluster_secret"))
    try:
        with edit_users(users_file) as box:
            if name in box[0].users:
                raise ValueError(f"user {name!r} exists (use 'txbroker user passwd')")
            box[0] = box[0].with_password(name, _read_password(password_stdin), roles)
    except (ValueError, OSError) as exc:
        raise _fail(users_file, exc) from None
    click.echo(f"user {name} added" + (f" with role(s) {', '.join(roles)}" if roles else ""))


@user.command()
@click.argument("name")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of stdin (default: prompt twice).")
@users_file_option
def passwd(name: str, password_stdin: bool, users_file: str) -> None:
    """Set a new password for user NAME (new salts too; its access keys stay)."""
    try:
        with edit_users(users_file) as box:
            if name not in box[0].users:
                raise ValueError(f"no user {name!r}")
            box[0] = box[0].with_password(name, _read_password(password_stdin))
    except (ValueError, OSError) as exc:
        raise _fail(users_file, exc) from None
    click.echo(f"password of user {name} changed")


@user.command()
@click.argument("name")
@users_file_option
def delete(name: str, users_file: str) -> None:
    """Delete user NAME and its access keys."""
    try:
        with edit_users(users_file) as box:
            box[0] = box[0].without(name)
    except (ValueError, OSError) as exc:
        raise _fail(users_file, exc) from None
    click.echo(f"user {name} deleted")


@user.command("access-key")
@click.argument("name")
@users_file_option
def access_key(name: str, users_file: str) -> None:
    """Create a RocketMQ access key and secret for user NAME; the secret is printed only now."""
    try:
        with edit_users(users_file) as box:
            box[0], key, secret = box[0].with_access_key(name)
    except (ValueError, OSError) as exc:
        raise _fail(users_file, exc) from None
    click.echo(f"access key {key} created for user {name}")
    click.echo(f"accessKey: {key}")
    click.echo(f"secretKey: {secret}")


@user.command("list")
@users_file_option
def list_(users_file: str) -> None:
    """List users: name, roles, SCRAM mechanisms and access keys (never secrets)."""
    try:
        users = load_users(users_file, missing_ok=True)
    except (ValueError, OSError) as exc:
        raise _fail(users_file, exc) from None
    for u in sorted(users.users.values(), key=lambda u: u.name):
        click.echo(f"{u.name}  roles={','.join(u.roles) or '-'}  "
                   f"scram={','.join(sorted(u.scram)) or '-'}  "
                   f"access_keys={','.join(sorted(u.access_keys)) or '-'}")
    click.echo(f"{len(users.users)} user(s) in {users_file}")
