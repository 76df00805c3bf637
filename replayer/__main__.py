import sys

if sys.argv[1:2] == ["sim"]:  # the simulator starts fast: skip the CLI's config machinery
    from replayer.sim import main as sim_main

    sys.exit(sim_main(sys.argv[2:]))

from replayer.cli import main  # noqa: E402

sys.exit(main())
