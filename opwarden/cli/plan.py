"""`opwarden plan [MODEL] [--batch N] [--input ...] [--png FILE] [--all] [--json]`.

The static memory plan of a model for given feeds (opwarden.plan.report): its buffers with
their offsets and lifetimes, the arena size against the lower bound, and a picture of the
arena (SVG without a dependency, else PNG).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from opwarden.cli.common import console, model_source
from opwarden.cli.feeds import parse_inputs, random_feeds


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `plan` to the opwarden subcommands."""
    pl = sub.add_parser("plan", help="static memory plan: arena, lower bound, buffers, picture")
    pl.add_argument("model", nargs="?", help="model path or light-zoo name (default ResNet-50)")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--png", metavar="FILE", help="arena picture (.svg: no dependency; else PNG)")
    pl.add_argument("--batch", type=int, default=1, help="value for symbolic input dims")
    pl.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    pl.add_argument("--all", action="store_true", help="list every buffer")
    pl.set_defaults(fn=cmd_plan)
    return pl


def cmd_plan(args: argparse.Namespace) -> int:
    from opwarden.options import SessionOptions
    from opwarden.plan import report
    from opwarden.session import InferenceSession

    source, label = model_source(args.model)
    sess = InferenceSession(source, sess_options=SessionOptions())
    feeds = random_feeds(sess, 0, batch=args.batch)
    feeds.update(parse_inputs(args.input or []))
    plan = sess.plan_for(feeds)
    picture = report.save_picture(plan, args.png) if args.png else None
    if args.json:
        out = plan.to_dict()
        out["model"] = label
        if picture:
            out["picture"] = picture
        print(json.dumps(out, indent=1))
        return 0
    con = console()
    con.print(report.table(plan, limit=None if args.all else 40))
    for line in report.summary_lines(plan):
        con.print(line)
    if picture:
        con.print(f"arena picture: {picture}")
    return 0
