from myriad_agent.cli import main

raise SystemExit(main())
