"""SQL questions with gold queries over the databases built from sql/*.sql (written for jaxagent).

Each entry: id, db (script name), question, gold (the reference query). A gold query with a top-level
ORDER BY makes the comparison order-sensitive.
"""

SQL_TASKS = (
    # ---------------------------------------------------------------- shop
    dict(id="shop-01", db="shop",
         question="List the names of all customers who live in France.",
         gold="SELECT name FROM customers WHERE country = 'France'"),
    dict(id="shop-02", db="shop",
         question="How many products are out of stock?",
         gold="SELECT COUNT(*) FROM products WHERE stock = 0"),
    dict(id="shop-03", db="shop",
         question="For each product category, give the category and its number of products, "
                  "ordered by category name.",
         gold="SELECT category, COUNT(*) FROM products GROUP BY category ORDER BY category"),
    dict(id="shop-04", db="shop",
         question="What is the total revenue (sum of quantity times unit price) of all shipped orders?",
         gold="SELECT SUM(oi.quantity * oi.unit_price) FROM order_items oi "
              "JOIN orders o ON o.id = oi.order_id WHERE o.status = 'shipped'"),
    dict(id="shop-05", db="shop",
         question="Which customers have never placed an order? Give their names.",
         gold="SELECT name FROM customers WHERE id NOT IN (SELECT customer_id FROM orders)"),
    dict(id="shop-06", db="shop",
         question="List the three most expensive products with their prices, most expensive first.",
         gold="SELECT name, price FROM products ORDER BY price DESC LIMIT 3"),
    dict(id="shop-07", db="shop",
         question="Which products have never been ordered? Give their names.",
         gold="SELECT name FROM products WHERE id NOT IN (SELECT product_id FROM order_items)"),
    dict(id="shop-08", db="shop",
         question="For each customer who placed at least two orders (of any status), give the "
                  "customer's name and their number of orders.",
         gold="SELECT c.name, COUNT(*) FROM customers c JOIN orders o ON o.customer_id = c.id "
              "GROUP BY c.id HAVING COUNT(*) >= 2"),
    dict(id="shop-09", db="shop",
         question="In which order lines was a product sold below its list price? Give the order id "
                  "and the product name.",
         gold="SELECT oi.order_id, p.name FROM order_items oi JOIN products p ON p.id = oi.product_id "
              "WHERE oi.unit_price < p.price"),
    # ---------------------------------------------------------------- school
    dict(id="school-01", db="school",
         question="How many students have enrolled in 'Calculus I' (in any semester)?",
         gold="SELECT COUNT(*) FROM enrollments e JOIN courses c ON c.id = e.course_id "
              "WHERE c.title = 'Calculus I'"),
    dict(id="school-02", db="school",
         question="List the titles of the courses taught by Dr. Sofia Rossi.",
         gold="SELECT c.title FROM courses c JOIN teachers t ON t.id = c.teacher_id "
              "WHERE t.name = 'Dr. Sofia Rossi'"),
    dict(id="school-03", db="school",
         question="For every student with at least one graded enrollment, give the student's name and "
                  "average grade, highest average first.",
         gold="SELECT s.name, AVG(e.grade) FROM students s JOIN enrollments e ON e.student_id = s.id "
              "WHERE e.grade IS NOT NULL GROUP BY s.id ORDER BY AVG(e.grade) DESC"),
    dict(id="school-04", db="school",
         question="Which students are taking a course that has no grade yet? Give each name once.",
         gold="SELECT DISTINCT s.name FROM students s JOIN enrollments e ON e.student_id = s.id "
              "WHERE e.grade IS NULL"),
    dict(id="school-05", db="school",
         question="For each department, give the department and the total credits of its courses.",
         gold="SELECT department, SUM(credits) FROM courses GROUP BY department"),
    dict(id="school-06", db="school",
         question="Which teacher or teachers teach the largest number of courses? Give their names.",
         gold="SELECT t.name FROM teachers t JOIN courses c ON c.teacher_id = t.id GROUP BY t.id "
              "HAVING COUNT(*) = (SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM courses "
              "GROUP BY teacher_id))"),
    dict(id="school-07", db="school",
         question="List the names of the students who failed at least one course (a grade below 60).",
         gold="SELECT DISTINCT s.name FROM students s JOIN enrollments e ON e.student_id = s.id "
              "WHERE e.grade < 60"),
    dict(id="school-08", db="school",
         question="Give the codes of the courses that no first-year student has taken.",
         gold="SELECT code FROM courses WHERE id NOT IN (SELECT e.course_id FROM enrollments e "
              "JOIN students s ON s.id = e.student_id WHERE s.year = 1)"),
    # ---------------------------------------------------------------- library
    dict(id="library-01", db="library",
         question="Which books are currently on loan (not yet returned)? Give their titles.",
         gold="SELECT b.title FROM books b JOIN loans l ON l.book_id = b.id WHERE l.return_date IS NULL"),
    dict(id="library-02", db="library",
         question="How many different titles by Ursula K. Le Guin does the library hold?",
         gold="SELECT COUNT(*) FROM books b JOIN authors a ON a.id = b.author_id "
              "WHERE a.name = 'Ursula K. Le Guin'"),
    dict(id="library-03", db="library",
         question="For each member who borrowed something, give the member's name and number of loans, "
                  "most loans first and ties broken by name.",
         gold="SELECT m.name, COUNT(*) AS n FROM members m JOIN loans l ON l.member_id = m.id "
              "GROUP BY m.id ORDER BY n DESC, m.name"),
    dict(id="library-04", db="library",
         question="List the titles of the books that have never been borrowed.",
         gold="SELECT title FROM books WHERE id NOT IN (SELECT book_id FROM loans)"),
    dict(id="library-05", db="library",
         question="Which authors have at least one book published before 1970? Give their names in "
                  "alphabetical order.",
         gold="SELECT DISTINCT a.name FROM authors a JOIN books b ON b.author_id = a.id "
              "WHERE b.year < 1970 ORDER BY a.name"),
    dict(id="library-06", db="library",
         question="What is the average loan duration in days over the loans that were returned?",
         gold="SELECT AVG(julianday(return_date) - julianday(loan_date)) FROM loans "
              "WHERE return_date IS NOT NULL"),
)
