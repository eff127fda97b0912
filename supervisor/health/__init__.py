"""Node health: readings taken by ``probe`` (NVML, /dev/shm), judged by the pure ``checks``."""
