/* slurmk8s health check: the smallest useful MPI job. Every rank contributes rank + 1 to an
 * allreduce and checks the sum; rank 0 prints "mpi-loopback ok <size>". Run with 2 ranks on one
 * node (shared-memory transport) by provisioner/health.py. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size, mine, sum = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mine = rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (sum != size * (size + 1) / 2) {
        fprintf(stderr, "mpi-loopback: rank %d got sum %d, expected %d\n", rank, sum, size * (size + 1) / 2);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (rank == 0)
        printf("mpi-loopback ok %d\n", size);
    MPI_Finalize();
    return 0;
}
