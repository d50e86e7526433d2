//! A tour of the Tensor API: creation, broadcasting, reductions, views and slices, joining
//! and splitting, in-place updates, and errors as `Result`s.
//! Run: `cargo run --example tensors`.

use gt::{s, step, NEW};

fn main() -> anyhow::Result<()> {
    let _gt = gt::init()?;
    let x = gt::arange(0.0, 12.0, 1.0)?.reshape(&[3, 4])?;
    let row = gt::tensor(&[10.0, 20.0, 30.0, 40.0])?;
    println!("x + row = {:?}", (&x + &row).to_vec()?); // broadcasting; operators panic on error
    println!("2 * x - 1 = {:?}", (2.0 * &x - 1.0).to_vec()?);
    println!("x ^ 0.5 = {:?}", x.pow(0.5)?.to_vec()?);
    println!("row sums = {:?}", x.sum_dims(&[1], false)?.to_vec()?);
    println!("column max (keepdim) = {:?} {:?}", x.max_dims(&[0], true)?.shape(), x.max_dims(&[0], true)?.to_vec()?);
    println!("x.t() @ x = {:?}", x.t()?.matmul(&x)?.shape());
    println!("x[1:, ::-2] = {:?}", x.slice(&s![1.., step(.., -2)])?.to_vec()?);
    println!("x[new, -1] = {:?}", x.slice(&s![NEW, -1])?.shape());
    let parts = x.chunk(2, 1)?;
    println!("chunks: {:?}", parts.iter().map(|p| p.shape().to_vec()).collect::<Vec<_>>());
    println!("cat back: {:?}", gt::cat(&[&parts[1], &parts[0]], 1)?.to_vec()?);
    println!("where x > 5: {:?}", gt::where_(&x.gt(5.0)?, &x, 0.0)?.to_vec()?);

    let p = gt::zeros(&[3])?;
    p.add_assign(1.5)?; // in place: every clone of `p` sees it
    println!("p = {:?}", p.to_vec()?);

    // Errors name the op and the shapes; nothing is sent.
    match x.matmul(&row.reshape(&[2, 2])?) {
        Err(e) => println!("error: {e}"),
        Ok(_) => unreachable!("[3, 4] @ [2, 2] does not fit"),
    }
    println!("one element: {}", x.sum()?.item()?);
    Ok(())
}
