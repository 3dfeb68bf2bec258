"""`python -m specrl_openrlhf.cli.train_ppo_ray --rollout_reuse spec --lenience 1.65 <any OpenRLHF flag>`, also
installed as the console script `specrl-train-ppo-ray`."""

import os
import sys

CONSOLE_SCRIPT = "specrl-train-ppo-ray"  # pyproject.toml's [project.scripts]


def main(argv=None, prog=None) -> None:
    from specrl_openrlhf.integration.openrlhf.seams import main as run

    if prog is None and os.path.basename(sys.argv[0]) == CONSOLE_SCRIPT:
        prog = CONSOLE_SCRIPT  # help and errors name the command the user typed
    run(argv, prog=prog)


if __name__ == "__main__":
    main()
