// apps/run_main.cpp — titan-run, the torchrun-style launcher (see launcher/launcher.h).
#include "launcher/launcher.h"

int main(int argc, char** argv) { return titan::launcher::launcher_main(argc, argv); }
