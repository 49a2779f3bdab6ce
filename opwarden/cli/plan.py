"""`opwarden plan [MODEL] [--batch N] [--dim NAME=N] [--input ...] [--png FILE] [--all] [--json]`.

The static memory plan of a model for given feeds (opwarden.plan.report): its buffers with
their offsets and lifetimes, the arena size against the lower bound, and a picture of the
arena (.svg without a dependency, .png through matplotlib).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from opwarden.cli.common import (
    add_model_arg,
    console,
    model_source,
    positive_int,
    writable_file,
)
from opwarden.cli.feeds import make_feeds, parse_dims

PICTURE_SUFFIXES = (".svg", ".png")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `plan` to the opwarden subcommands."""
    pl = sub.add_parser("plan", help="static memory plan: arena, lower bound, buffers, picture",
                        description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(pl)
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--png", metavar="FILE",
                    help="write the arena picture (.svg: no dependency; .png: matplotlib)")
    pl.add_argument("--batch", type=positive_int, default=1,
                    help="value for symbolic input dims (default 1)")
    pl.add_argument("--dim", action="append", metavar="NAME=N",
                    help="size of one symbolic input dimension (overrides --batch for it)")
    pl.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                    help="plan for this input read from a .npy file (repeatable)")
    pl.add_argument("--all", action="store_true", help="list every buffer (default: 40)")
    pl.set_defaults(fn=cmd_plan)
    return pl


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan the model's memory for the feeds; print (or --json) it, write the picture."""
    from opwarden.options import SessionOptions
    from opwarden.plan import report
    from opwarden.session import InferenceSession

    if args.png:
        writable_file(args.png, "--png", PICTURE_SUFFIXES)  # before the work, not after it
    source, label = model_source(args.model)
    sess = InferenceSession(source, sess_options=SessionOptions())
    feeds = make_feeds(sess, args.input, 0, batch=args.batch, dims=parse_dims(args.dim))
    plan = sess.plan_for(feeds)
    picture = report.save_picture(plan, args.png, label) if args.png else None
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
