"""The roster's follower, a service the hub starts (hub.services): every few seconds it reads
the roster file and makes the hub's users match it, so that a learner added to the file can
log in and one removed cannot, without restarting the hub (which would not stop anyone's
server either, but would make everyone log in again).

A learner on the roster, or named in DPMP_LAB_HUB_LEARNERS, and not yet a user of the hub is
added (the hub's allowed_users takes them: any authenticator then lets them in); a user of the
hub who is on neither, and is no instructor, is removed, their server stopped first. Their
account and home stay: the server's administrator removes those. A roster that cannot be read
changes nothing, and says why in the hub's log, and so does one changed within the last two
seconds (an editor may still be writing it: write a new roster beside the old and rename it
over, and no pass reads half of one).

    python -m dpmp_lab.instructor.hub_roster --roster roster.csv --keep teacher,ada
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from dpmp_lab.instructor.hub_settings import HubConfigError, read_roster

SETTLE_S = 2.0


class HubAPI:
    """JupyterHub's REST API with the service's token (JUPYTERHUB_API_URL, _TOKEN)."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token

    def call(self, method: str, path: str) -> object:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            body = reply.read()
        return json.loads(body) if body else None

    def users(self) -> set[str]:
        return {user["name"] for user in self.call("GET", "/users")}

    def add(self, name: str) -> None:
        self.call("POST", f"/users/{urllib.parse.quote(name)}")

    def remove(self, name: str) -> None:
        quoted = urllib.parse.quote(name)
        try:
            self.call("DELETE", f"/users/{quoted}/server")
        except urllib.error.HTTPError as no_server:   # 400: none running
            if no_server.code not in (400, 404):
                raise
        for _ in range(60):   # the user goes once the server has stopped
            try:
                self.call("DELETE", f"/users/{quoted}")
                return
            except urllib.error.HTTPError as busy:
                if busy.code != 400:
                    raise
                time.sleep(1)


def sync(api: HubAPI, roster: Path, keep: set[str], say=print, settle: float = SETTLE_S,
         ) -> tuple[set[str], set[str]]:
    """One pass: (added, removed). A roster changed less than `settle` seconds ago waits for
    the next pass: an editor may be writing it."""
    try:
        if time.time() - roster.stat().st_mtime < settle:
            return set(), set()
    except OSError:
        pass   # read_roster says why
    try:
        wanted = set(read_roster(roster)) | keep
    except HubConfigError as bad:
        say(f"roster not followed this time: {bad}")
        return set(), set()
    present = api.users()
    added, removed = wanted - present, present - wanted
    for name in sorted(added):
        api.add(name)
        say(f"added {name} (on the roster)")
    for name in sorted(removed):
        api.remove(name)
        say(f"removed {name} (no longer on the roster)")
    return added, removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--roster", type=Path, required=True)
    parser.add_argument("--keep", default="", help="users the roster does not decide on")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between passes")
    args = parser.parse_args(argv)
    api = HubAPI(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])
    keep = {name for name in args.keep.split(",") if name}
    say = lambda text: print(f"[roster] {text}", file=sys.stderr, flush=True)  # noqa: E731
    while True:
        try:
            sync(api, args.roster, keep, say)
        except (OSError, urllib.error.URLError) as failed:   # the hub restarting: next pass
            say(f"the hub did not answer: {failed}")
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
