import sys

from supervisor.agent.main import main

sys.exit(main())
