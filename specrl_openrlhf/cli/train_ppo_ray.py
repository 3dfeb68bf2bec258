"""`python -m specrl_openrlhf.cli.train_ppo_ray --rollout_reuse spec --lenience 1.65 <any OpenRLHF flag>`."""


def main(argv=None, prog=None) -> None:
    from specrl_openrlhf.integration.openrlhf_cli import PROG
    from specrl_openrlhf.integration.openrlhf_cli import main as run

    run(argv, prog=prog or PROG)


if __name__ == "__main__":
    main()
