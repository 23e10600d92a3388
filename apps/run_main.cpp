// apps/run_main.cpp — titan-run, the torchrun-style launcher (see parallel/launcher.h).
#include "parallel/launcher.h"

int main(int argc, char** argv) { return titan::parallel::launcher_main(argc, argv); }
